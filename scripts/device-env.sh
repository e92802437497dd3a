# scripts/device-env.sh — source this on the GPU machine (the `run` tool's bare copy of the tree) before `make`.
# That machine has nvcc and PyTorch but no Debian -dev packages and no network, so the build's libraries
# travel as Debian .deb files in the ignored folder .devdeps/ (name it in the run's `carry`; fill it here with
# `scripts/device-env.sh --fetch`). Sourcing unpacks them into /tmp/sysroot (never into /, whose own libraries
# the machine's Python stack depends on) and points pkg-config, the compiler and the loader at it. Libraries the
# machine already has are left alone: .devdeps/fallback/ (gnutls and its deps, which libmicrohttpd links) is only
# used when the loader cannot find them.

if [ "${1:-}" = "--fetch" ]; then
    set -e
    mkdir -p .devdeps/fallback
    grep -qx '/.devdeps/' .git/info/exclude 2>/dev/null || echo /.devdeps/ >> .git/info/exclude
    (cd .devdeps && apt-get download libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 libpcre2-16-0 \
        libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2 libpng-dev libpng16-16 libjpeg62-turbo-dev \
        libjpeg62-turbo libwebp-dev libwebp7 libwebpdemux2 libwebpmux3 libmicrohttpd-dev libmicrohttpd12 \
        libgif-dev libgif7 zlib1g-dev pkgconf pkgconf-bin libpkgconf3)
    (cd .devdeps/fallback && apt-get download libgnutls30 libnettle8 libhogweed6 libp11-kit0 libidn2-0 \
        libtasn1-6 libunistring2 libgmp10 libffi8)
    return 0 2>/dev/null || exit 0
fi

ci_devenv() {
    local pkgs="jansson libpcre2-8 libutf8proc libpng libjpeg libwebp libmicrohttpd"
    if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists $pkgs 2>/dev/null && [ -e /usr/include/gif_lib.h ]; then
        echo "device-env: the system has every library; nothing to do"
        return 0
    fi
    if [ ! -d .devdeps ] || ! ls .devdeps/*.deb >/dev/null 2>&1; then
        echo "device-env: libraries missing and no .devdeps/*.deb carried (run scripts/device-env.sh --fetch here and carry .devdeps)" >&2
        return 1
    fi
    local root=/tmp/sysroot lib=/tmp/sysroot/usr/lib/x86_64-linux-gnu f
    mkdir -p "$root"
    for f in .devdeps/*.deb; do dpkg-deb -x "$f" "$root" || return 1; done
    # the loader's own view decides whether the fallback runtime libraries are needed
    if ! ldconfig -p | grep -q 'libgnutls\.so\.30'; then
        for f in .devdeps/fallback/*.deb; do dpkg-deb -x "$f" "$root" || return 1; done
        echo "device-env: using the carried gnutls runtime"
    fi
    # Debian's -dev packages leave absolute symlinks (libfoo.so -> /usr/lib/...) that point outside the sysroot
    local l t
    for l in $(find "$root" -type l); do
        t=$(readlink "$l")
        case "$t" in /*) ln -sfn "$root$t" "$l" ;; esac
    done
    export PATH="$root/usr/bin:$PATH"
    export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$root/usr/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR="$root"
    export CPATH="$root/usr/include:$root/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    [ -e "$root/usr/bin/pkg-config" ] || ln -sf pkgconf "$root/usr/bin/pkg-config"
    if pkg-config --libs $pkgs >/dev/null; then
        echo "device-env: libraries from .devdeps in $root: $(pkg-config --libs $pkgs)"
    else
        echo "device-env: pkg-config still cannot resolve: $pkgs" >&2
        return 1
    fi
}
ci_devenv
