#!/usr/bin/env python3
"""tokenizer_goldens.py — makes the tokenizer fixtures that tests/unit/test_tokenizer.c checks cinfer against.

  synth OUT_DIR            (here, plain Python) writes small synthetic tokenizer.json files that exercise the
                           components the real tokenizers do not (lstrip/rstrip/single_word added tokens,
                           Metaspace schemes, Split behaviours, Digits, Punctuation, Whitespace, NFKD, ...).
                           Deterministic: re-running reproduces the committed files byte for byte.
  goldens OUT_DIR NAME=DIR ...   (where the HF `tokenizers` library is installed) loads each DIR/tokenizer.json
                           with tokenizers.Tokenizer.from_file, encodes every line of corpus.jsonl with
                           add_special_tokens False and True, decodes the ids with and without
                           skip_special_tokens, decodes seeded random id lists, and writes OUT_DIR/NAME.goldens.jsonl.
                           Where transformers can load DIR offline it also records AutoTokenizer's ids for
                           add_special_tokens=True (field "tf_ids_special") so differences are visible.
  benchcorpus OUT.jsonl     writes the >= 10 MB benchmark corpus: this Python's stdlib sources in <= 4 KB
                           chunks (code, English prose in docstrings) mixed with seeded shuffles of corpus.jsonl
                           (many scripts, emoji, CJK), one JSON string per line (a document).
  bench CORPUS NAME=DIR ...  times single-threaded HF encode (one encode() call per document, no
                           encode_batch, RAYON_NUM_THREADS=1) over CORPUS (a JSONL of documents) and prints MB/s.
DIR may hold tokenizer.json.xz instead of tokenizer.json (so the files travel small)."""
import json
import lzma
import os
import random
import re
import sys
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CORPUS = os.path.join(ROOT, "tests", "fixtures", "tokenizers", "corpus.jsonl")


def read_corpus(path=CORPUS):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------- synthetic tokenizers

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train_bpe(words, n_merges):
    """Plain BPE training: words is a Counter of tuples of symbols. Ties broken by the pair itself so the
    result does not depend on dict order."""
    words = {w: c for w, c in words.items()}
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        nw = {}
        for w, c in words.items():
            out = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            nw[tuple(out)] = nw.get(tuple(out), 0) + c
        words = nw
    return merges


def training_text():
    text = read_corpus()
    # Some ordinary English so merges look like a real vocabulary.
    text += ["the quick brown fox jumps over the lazy dog and the cat sat on the mat while the dog ran"] * 20
    text += ["hello world this is a test of the tokenizer with some words repeated words words"] * 20
    return text


def base_bytelevel(n_merges=700):
    b2u = bytes_to_unicode()
    words = Counter()
    for t in training_text():
        for w in re.findall(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+", t):
            words[tuple(b2u[b] for b in w.encode("utf-8"))] += 1
    merges = train_bpe(words, n_merges)
    vocab = {}
    for b in range(256):
        vocab[b2u[b]] = len(vocab)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    return vocab, merges


def base_sentencepiece(n_merges=700):
    words = Counter()
    chars = Counter()
    for t in training_text():
        t = "\u2581" + t.replace(" ", "\u2581")
        for w in re.findall(r"\u2581?[^\u2581]+|\u2581", t):
            words[tuple(w)] += 1
            chars.update(w)
    merges = train_bpe(words, n_merges)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    # Rare characters stay out of the vocabulary so byte fallback / unk paths are exercised.
    for c in sorted(c for c, n in chars.items() if n >= 3):
        if c not in vocab:
            vocab[c] = len(vocab)
    kept = []
    for a, b in merges:
        if a in vocab and b in vocab:
            kept.append((a, b))
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
    return vocab, kept


def added(id_, content, special=True, lstrip=False, rstrip=False, single_word=False, normalized=None):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def bl(add_prefix_space=False, use_regex=True, trim_offsets=False):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": trim_offsets,
            "use_regex": use_regex}


def split(pattern, behavior, invert=False, regex=True):
    return {"type": "Split", "pattern": {"Regex" if regex else "String": pattern}, "behavior": behavior,
            "invert": invert}


def template(single, specials):
    def piece(p):
        if p.startswith("$"):
            return {"Sequence": {"id": p[1:], "type_id": 0}}
        return {"SpecialToken": {"id": p, "type_id": 0}}
    return {"type": "TemplateProcessing", "single": [piece(p) for p in single.split()],
            "pair": [piece(p) for p in single.split()] + [{"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {name: {"id": name, "ids": [i], "tokens": [name]} for name, i in specials.items()}}


def bpe_model(vocab, merges, pairs=True, **kw):
    m = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False}
    m.update(kw)
    m["vocab"] = vocab
    m["merges"] = [[a, b] for a, b in merges] if pairs else ["%s %s" % (a, b) for a, b in merges]
    return m


def hf_ids(model, added_tokens):
    """Gives added tokens the ids HF's add_tokens assigns (the vocabulary's id where the content is a token,
    else the next id after the vocabulary), so the files' ids are the ones the library uses."""
    nxt = len(model["vocab"])
    seen = {}
    for a in added_tokens:
        if a["content"] in seen:
            a["id"] = seen[a["content"]]
        elif a["content"] in model["vocab"]:
            a["id"] = model["vocab"][a["content"]]
        else:
            a["id"] = nxt
            nxt += 1
        seen[a["content"]] = a["id"]
    return added_tokens


def tok_json(model, added_tokens, normalizer=None, pre=None, post=None, decoder=None):
    added_tokens = hf_ids(model, [dict(a) for a in added_tokens])
    by_content = {a["content"]: a["id"] for a in added_tokens}

    def fix(p):  # template special tokens carry the ids their contents got
        if not p:
            return
        if p.get("type") == "TemplateProcessing":
            for name, st in p["special_tokens"].items():
                st["ids"] = [by_content.get(name, model["vocab"].get(name, st["ids"][0]))]
        for q in p.get("processors", []):
            fix(q)
    fix(post)
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
            "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": post, "decoder": decoder,
            "model": model}


def make_synth(out_dir):
    blv, blm = base_bytelevel()
    spv, spm = base_sentencepiece()
    n_bl, n_sp = len(blv), len(spv)

    def bl_added(extra=()):
        toks = [added(n_bl, "<|endoftext|>"), added(n_bl + 1, "<mask>", lstrip=True),
                added(n_bl + 2, "<sep>", rstrip=True), added(n_bl + 3, "[NL]", special=False, normalized=False),
                added(n_bl + 4, "cat", special=False, single_word=True), added(n_bl + 5, "<s>"),
                added(n_bl + 6, "</s>"), added(n_bl + 7, " world", special=False, lstrip=True, rstrip=True)]
        return toks + list(extra)

    def sp_added():
        return [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>"),
                added(n_sp, "<mask>", lstrip=True, rstrip=True), added(n_sp + 1, "<sep>", rstrip=True),
                added(n_sp + 2, "cat", special=False, single_word=True),
                added(n_sp + 3, "Hello", special=False, normalized=True),
                added(n_sp + 4, "<|im_start|>"), added(n_sp + 5, "[NL]", special=False, normalized=False)]

    bl_dec = bl(add_prefix_space=True, use_regex=True, trim_offsets=True)
    sp_dec_llama = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}

    synth = {
        # GPT-2 style: ByteLevel with the built-in regex and a prefix space, every added-token flag.
        "synth_bl_gpt2": tok_json(bpe_model(blv, blm), bl_added(), None, bl(True, True),
                                  bl(True, True), bl_dec),
        # Normalizers in a sequence; Split(Removed) on a string; ByteLevel without regex; templates.
        "synth_bl_norm": tok_json(
            bpe_model(blv, blm, pairs=False, ignore_merges=True), bl_added(),
            {"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "Lowercase"},
                                                 {"type": "Strip", "strip_left": True, "strip_right": True},
                                                 {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}]},
            {"type": "Sequence", "pretokenizers": [split(" ", "Removed", regex=False), bl(False, False)]},
            {"type": "Sequence", "processors": [bl(False, False), template("<s> $A </s>", {"<s>": n_bl + 5, "</s>": n_bl + 6})]},
            bl_dec),
        "synth_bl_mwp": tok_json(bpe_model(blv, blm), bl_added(), {"type": "NFC"},
                                 {"type": "Sequence", "pretokenizers": [split("\\p{P}", "MergedWithPrevious"), bl(False, False)]},
                                 None, bl_dec),
        "synth_bl_mwn": tok_json(bpe_model(blv, blm), bl_added(), {"type": "NFD"},
                                 {"type": "Sequence", "pretokenizers": [split("\\s+", "MergedWithNext"), bl(True, False)]},
                                 template("<s> $A", {"<s>": n_bl + 5}), bl_dec),
        "synth_bl_contig_invert": tok_json(
            bpe_model(blv, blm), bl_added(), {"type": "Prepend", "prepend": "> "},
            {"type": "Sequence", "pretokenizers": [split("\\p{L}+", "Contiguous", invert=True), bl(False, False)]},
            None, bl_dec),
        "synth_bl_isolated_invert": tok_json(
            bpe_model(blv, blm), bl_added(), None,
            {"type": "Sequence", "pretokenizers": [split("[a-z]+|\\d", "Isolated", invert=True),
                                                   split("(?i:the)", "Removed"), bl(False, True)]},
            None, bl_dec),
        "synth_bl_digits_punct": tok_json(
            bpe_model(blv, blm), bl_added(), {"type": "NFKC"},
            {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                   {"type": "Punctuation", "behavior": "Isolated"},
                                                   {"type": "WhitespaceSplit"}, bl(True, False)]},
            None, bl_dec),
        "synth_bl_whitespace": tok_json(
            bpe_model(blv, blm), bl_added(),
            {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Lowercase"},
                                                 {"type": "Strip", "strip_left": False, "strip_right": True}]},
            {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}, {"type": "Digits", "individual_digits": False},
                                                   {"type": "Punctuation", "behavior": "MergedWithNext"}, bl(False, True)]},
            None, bl_dec),
        "synth_bl_punct_removed": tok_json(
            bpe_model(blv, blm), bl_added(), {"type": "Replace", "pattern": {"String": "o"}, "content": "0"},
            {"type": "Sequence", "pretokenizers": [{"type": "Punctuation", "behavior": "Removed"},
                                                   {"type": "Punctuation", "behavior": "Contiguous"}, bl(False, True)]},
            None, {"type": "Sequence", "decoders": [bl_dec, {"type": "Replace", "pattern": {"String": "0"}, "content": "o"}]}),
        # SentencePiece-style, Llama-2 layout: Prepend + Replace normalizers, byte fallback, fused unk.
        "synth_sp_llama": tok_json(bpe_model(spv, spm, unk_token="<unk>", fuse_unk=True, byte_fallback=True),
                                   sp_added(),
                                   {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                                        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
                                   None, template("<s> $A", {"<s>": 1}), sp_dec_llama),
        "synth_sp_meta_first": tok_json(bpe_model(spv, spm, pairs=False, unk_token="<unk>", byte_fallback=True),
                                        sp_added(), {"type": "NFKC"},
                                        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
                                        template("<s> $A </s>", {"<s>": 1, "</s>": 2}),
                                        {"type": "Sequence", "decoders": [{"type": "ByteFallback"},
                                         {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}]}),
        "synth_sp_meta_always": tok_json(bpe_model(spv, spm, unk_token="<unk>", fuse_unk=False, byte_fallback=False),
                                         sp_added(), {"type": "Lowercase"},
                                         {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": False},
                                         None,
                                         {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": False}),
        "synth_sp_meta_never": tok_json(bpe_model(spv, spm, unk_token="<unk>", fuse_unk=True, byte_fallback=True),
                                        sp_added(), None,
                                        {"type": "Sequence", "pretokenizers": [
                                            {"type": "Digits", "individual_digits": False},
                                            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True}]},
                                        None,
                                        {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"},
                                         {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True}]}),
    }
    for name, tj in synth.items():
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False, indent=None, separators=(",", ":"))
            f.write("\n")
    print("wrote %d synthetic tokenizers to %s" % (len(synth), out_dir))


# ---------------------------------------------------------------- goldens (needs `tokenizers`)

def load_tokenizer_json(d):
    p = os.path.join(d, "tokenizer.json")
    if os.path.exists(p):
        with open(p, encoding="utf-8") as f:
            return f.read()
    with lzma.open(p + ".xz", "rt", encoding="utf-8") as f:
        return f.read()


def random_id_lists(tok, rng, n_lists=40):
    """Seeded id lists for decode goldens: ordinary ids, special ids, byte-fallback <0x..> pieces and lone
    byte-level bytes (partial UTF-8), a few ids past the vocabulary (HF drops them)."""
    size = tok.get_vocab_size(with_added_tokens=True)
    vocab = tok.get_vocab(with_added_tokens=True)
    # the set once: inside the generator it was rebuilt per vocabulary entry (262k x ~6k added tokens for Gemma 3:
    # what made its goldens time out, not the encoding)
    special_set = {a.content for a in tok.get_added_tokens_decoder().values() if a.special}
    special = sorted(i for t, i in vocab.items() if t in special_set)
    bytes_ids = sorted(i for t, i in vocab.items() if re.fullmatch(r"<0x[0-9A-F]{2}>", t))
    b2u = bytes_to_unicode()
    high = sorted(vocab[b2u[b]] for b in range(0x80, 0x100) if b2u[b] in vocab)
    out = []
    for k in range(n_lists):
        n = rng.randint(1, 12)
        ids = []
        for _ in range(n):
            r = rng.random()
            if r < 0.15 and special:
                ids.append(rng.choice(special))
            elif r < 0.35 and bytes_ids:
                ids.append(rng.choice(bytes_ids))
            elif r < 0.5 and high:
                ids.append(rng.choice(high))
            elif r < 0.52:
                ids.append(size + rng.randint(0, 5))
            else:
                ids.append(rng.randrange(size))
        out.append(ids)
    return out


_WTOK = None


def _worker_row(text):
    t0 = time.time()
    row = _encode_row(_WTOK, text)
    if time.time() - t0 > 5:
        print("  slow text (%.1f s, %d chars): %r" % (time.time() - t0, len(text), text[:60]), flush=True)
    return row


def _encode_row(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    ids_sp = tok.encode(text, add_special_tokens=True).ids
    row = {"text": text, "ids": ids, "ids_special": ids_sp,
           "decode": tok.decode(ids, skip_special_tokens=False),
           "decode_skip": tok.decode(ids, skip_special_tokens=True)}
    if ids_sp != ids:
        row["decode_special"] = tok.decode(ids_sp, skip_special_tokens=False)
    return row


def goldens(out_dir, specs):
    from tokenizers import Tokenizer
    corpus = read_corpus()
    os.makedirs(out_dir, exist_ok=True)
    for spec in specs:
        name, d = spec.split("=", 1)
        t0 = time.time()
        rows = []
        try:
            tok = Tokenizer.from_str(load_tokenizer_json(d))
            print("  %s: loaded in %.1f s" % (name, time.time() - t0), flush=True)
        except Exception as e:  # a load error is itself a golden: cinfer must refuse the file too
            rows.append({"load_error": str(e)})
            tok = None
        tf = None
        # TOK_GOLDENS_NO_TF=1 skips the transformers comparison (loading Gemma 3 there takes minutes)
        if tok is not None and not os.environ.get("TOK_GOLDENS_NO_TF") and os.path.exists(os.path.join(d, "tokenizer_config.json")):
            try:
                from transformers import AutoTokenizer
                import tempfile, shutil
                tmp = tempfile.mkdtemp()
                with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
                    f.write(load_tokenizer_json(d))
                shutil.copy(os.path.join(d, "tokenizer_config.json"), tmp)
                tf = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
            except Exception as e:
                print("  %s: transformers could not load: %s" % (name, str(e)[:200]))
        if tok is not None:
            # TOK_GOLDENS_JOBS=N encodes the corpus in N processes (Gemma 3's BPE has no pre-tokenizer, so HF
            # merges over whole texts and one process takes minutes); rows stay in corpus order.
            jobs = int(os.environ.get("TOK_GOLDENS_JOBS", "1"))
            if jobs > 1:
                import multiprocessing as mp
                # the workers inherit the parent's loaded tokenizer through fork: loading Gemma 3's 33 MB file
                # again in each worker is what made the first parallel run time out
                global _WTOK
                _WTOK = tok
                with mp.get_context("fork").Pool(jobs) as pool:
                    base_rows = pool.map(_worker_row, corpus, chunksize=1)
            else:
                base_rows = [_encode_row(tok, text) for text in corpus]
            for text, row in zip(corpus, base_rows):
                if tf is not None:
                    try:
                        row["tf_ids_special"] = tf(text, add_special_tokens=True)["input_ids"]
                        row["tf_ids"] = tf(text, add_special_tokens=False)["input_ids"]
                    except Exception as e:
                        row["tf_error"] = str(e)[:200]
                rows.append(row)
            rng = random.Random(1234)
            for ids in random_id_lists(tok, rng):
                rows.append({"decode_ids": ids, "decode": tok.decode(ids, skip_special_tokens=False),
                             "decode_skip": tok.decode(ids, skip_special_tokens=True)})
        with open(os.path.join(out_dir, name + ".goldens.jsonl"), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print("%-28s %4d rows  %.1fs%s" % (name, len(rows), time.time() - t0, "" if tok else "  LOAD ERROR"))


def bench_corpus(out_path, target=12_000_000):
    import sysconfig
    lib = sysconfig.get_paths()["stdlib"]
    files = []
    for dp, dn, fn in os.walk(lib):
        dn.sort()
        if "site-packages" in dp or "test" in dp.split(os.sep)[-1]:
            continue
        files += [os.path.join(dp, f) for f in sorted(fn) if f.endswith(".py")]
    docs, total = [], 0
    for path in sorted(files):
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        chunk = ""
        for line in text.splitlines(keepends=True):
            if len(chunk) + len(line) > 4096 and chunk:
                docs.append(chunk)
                chunk = ""
            chunk += line
        if chunk:
            docs.append(chunk)
        total = sum(len(d.encode()) for d in docs)
        if total > target * 0.7:
            break
    corpus = [c for c in read_corpus() if c]
    rng = random.Random(7)
    mixed = []
    while total < target:
        doc = " ".join(rng.choice(corpus) for _ in range(24))
        mixed.append(doc)
        total += len(doc.encode())
    docs += mixed
    rng.shuffle(docs)
    with open(out_path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    print("%d docs, %.2f MB" % (len(docs), total / 1e6))


def bench(corpus_path, specs):
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from tokenizers import Tokenizer
    if corpus_path.endswith(".xz"):
        with lzma.open(corpus_path, "rt", encoding="utf-8") as f:
            docs = [json.loads(l) for l in f]
    else:
        with open(corpus_path, encoding="utf-8") as f:
            docs = [json.loads(l) for l in f]
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    for spec in specs:
        name, d = spec.split("=", 1)
        tok = Tokenizer.from_str(load_tokenizer_json(d))
        best = None
        for rep in range(3):
            t0 = time.perf_counter()
            ntok = 0
            for doc in docs:
                ntok += len(tok.encode(doc, add_special_tokens=False).ids)
            dt = time.perf_counter() - t0
            best = dt if best is None or dt < best else best
        print("HF tokenizers %s: %d docs, %.2f MB, %d tokens, best of 3 %.3f s, %.2f MB/s single thread"
              % (name, len(docs), nbytes / 1e6, ntok, best, nbytes / 1e6 / best))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    cmd = sys.argv[1]
    if cmd == "synth":
        make_synth(sys.argv[2])
    elif cmd == "goldens":
        goldens(sys.argv[2], sys.argv[3:])
    elif cmd == "benchcorpus":
        bench_corpus(sys.argv[2])
    elif cmd == "bench":
        bench(sys.argv[2], sys.argv[3:])
    else:
        print(__doc__)
        sys.exit(2)
