#!/usr/bin/env bash
# install-deps.sh — installs the Debian packages cinfer builds and tests with. Idempotent: silent when
# everything is already there. Run as root or with sudo available.
set -euo pipefail

pkgs=(
  build-essential pkg-config clang libclang-rt-14-dev   # compiler, libFuzzer/ASan runtimes
  libjansson-dev                                        # JSON
  libpcre2-dev                                          # tokenizer regexes (JIT, UTF, \p{..})
  libutf8proc-dev                                       # Unicode normalization
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
