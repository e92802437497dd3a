#!/usr/bin/env python3
"""template_goldens.py — renders every (chat template x conversation x kwargs set) of tests/fixtures/templates
with transformers' apply_chat_template(tokenize=False) and writes tests/fixtures/templates/goldens.jsonl: one
line per render with either the exact output or the exception (type and message).

Run where transformers is installed (the GPU machine): `python3 tools/oracle/template_goldens.py [--out DIR]`.
`--engine jinja2` renders with plain jinja2 set up like transformers' environment instead (for checking this
script where transformers is missing); its output is never committed as goldens.

Each template tests/fixtures/templates/<name>.jinja comes with <name>.tokens.json (bos/eos/pad/unk, null when the
tokenizer has none). The tokenizer handed to apply_chat_template is a tiny WordLevel tokenizer that knows only
those special tokens: apply_chat_template(tokenize=False) reads nothing else from it but the chat template and
the special tokens map, so this is the real code path without the real vocabularies.

strftime_now() reads the clock: every line records "now" (local time just before the render) so that a test can
render with the same date.
"""
import argparse
import datetime
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
FIX = os.path.join(ROOT, "tests", "fixtures", "templates")

# The kwargs sets every (template, conversation) pair is rendered with. Extra keys a template does not read are
# harmless; those it does read (enable_thinking, preserve_thinking, reasoning_effort, builtin_tools,
# date_string, add_vision_id) change the output of the templates that use them.
KWARGS_SETS = [
    {"add_generation_prompt": False},
    {"add_generation_prompt": True},
    {"add_generation_prompt": True, "enable_thinking": False},
    {"add_generation_prompt": True, "enable_thinking": True},
    {"add_generation_prompt": False, "preserve_thinking": True},
    {"add_generation_prompt": True, "reasoning_effort": "low", "builtin_tools": ["browser", "python"],
     "date_string": "01 Jan 2025", "add_vision_id": True, "model_identity": "You are Ünï, a test model."},
]


def load_templates():
    out = []
    for path in sorted(glob.glob(os.path.join(FIX, "*.jinja"))):
        name = os.path.basename(path)[: -len(".jinja")]
        with open(path, encoding="utf-8") as f:
            src = f.read()
        with open(os.path.join(FIX, name + ".tokens.json"), encoding="utf-8") as f:
            tokens = json.load(f)
        out.append((name, src, tokens))
    return out


class TransformersEngine:
    def __init__(self):
        import transformers
        import tokenizers

        self.transformers = transformers
        self.tokenizers = tokenizers
        self.name = "transformers %s apply_chat_template(tokenize=False)" % transformers.__version__
        self.versions = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__}
        try:
            import jinja2

            self.versions["jinja2"] = jinja2.__version__
        except ImportError:
            pass

    def make(self, src, tokens):
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast

        specials = [v for v in tokens.values() if v]
        vocab = {"[UNK]": 0}
        for s in specials:
            vocab.setdefault(s, len(vocab))
        tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
        kw = {k: v for k, v in tokens.items() if v}
        tok = PreTrainedTokenizerFast(tokenizer_object=tk, chat_template=src, **kw)
        return tok

    def special_map(self, tok):
        try:
            return {k: str(v) for k, v in tok.special_tokens_map.items()}
        except Exception as e:  # informational only
            return {"error": repr(e)}

    def render(self, tok, conv, kwargs):
        kw = dict(kwargs)
        agp = kw.pop("add_generation_prompt", False)
        args = dict(tokenize=False, add_generation_prompt=agp, **kw)
        if "tools" in conv:
            args["tools"] = conv["tools"]
        out = tok.apply_chat_template(conv["messages"], **args)
        if not isinstance(out, str):
            raise RuntimeError("apply_chat_template returned %s, not str" % type(out).__name__)
        return out


class Jinja2Engine:
    """transformers' environment rebuilt on plain jinja2: for checking this script only."""

    def __init__(self):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        import jinja2.ext

        self.jinja2 = jinja2
        self.name = "jinja2 %s (transformers environment emulated; not for goldens)" % jinja2.__version__
        self.versions = {"jinja2": jinja2.__version__}

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        def strftime_now(fmt):
            return datetime.datetime.now().strftime(fmt)

        class Generation(jinja2.ext.Extension):
            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
                return jinja2.nodes.Scope(body).set_lineno(lineno)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[Generation, jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        self.env = env

    def make(self, src, tokens):
        return (self.env.from_string(src), tokens)

    def special_map(self, tok):
        return {k: v for k, v in tok[1].items() if v}

    def render(self, tok, conv, kwargs):
        tmpl, tokens = tok
        kw = {k: v for k, v in tokens.items() if v}
        kw.update(kwargs)
        kw.setdefault("add_generation_prompt", False)
        return tmpl.render(messages=conv["messages"], tools=conv.get("tools"), documents=None, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=FIX, help="folder for goldens.jsonl and goldens.meta.json")
    ap.add_argument("--engine", choices=["transformers", "jinja2"], default="transformers")
    a = ap.parse_args()

    engine = TransformersEngine() if a.engine == "transformers" else Jinja2Engine()
    with open(os.path.join(FIX, "conversations.json"), encoding="utf-8") as f:
        convs = json.load(f)
    templates = load_templates()

    os.makedirs(a.out, exist_ok=True)
    n_ok = n_err = 0
    meta = {"engine": engine.name, "versions": engine.versions, "python": sys.version.split()[0],
            "kwargs_sets": KWARGS_SETS, "special_tokens_map": {}}
    with open(os.path.join(a.out, "goldens.jsonl"), "w", encoding="utf-8") as out:
        for name, src, tokens in templates:
            tok = engine.make(src, tokens)
            meta["special_tokens_map"][name] = engine.special_map(tok)
            for conv in convs:
                for kwargs in KWARGS_SETS:
                    rec = {"template": name, "conversation": conv["name"], "kwargs": kwargs}
                    rec["now"] = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
                    try:
                        rec["output"] = engine.render(tok, conv, kwargs)
                        n_ok += 1
                    except Exception as e:  # the template's own exception is the golden
                        rec["error_type"] = type(e).__name__
                        rec["error"] = str(e)
                        n_err += 1
                    out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    meta["counts"] = {"rendered": n_ok, "errors": n_err}
    with open(os.path.join(a.out, "goldens.meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("%s: %d rendered, %d errors -> %s" % (engine.name, n_ok, n_err, a.out))


if __name__ == "__main__":
    main()
