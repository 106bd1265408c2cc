#!/usr/bin/env bash
# Create the project's virtual environment from scratch on a fresh machine.
#   tools/setup_env.sh [VENV_DIR]
# Installs the pinned CPU build of torch (GPU users: set TORCH_SPEC, see docs/getting-started.md),
# every runtime and test dependency, then swaps stock Pillow for Pillow-SIMD
# (built with AVX2 when the CPU has it, after the codec headers: WebP, TIFF,
# JPEG 2000, LittleCMS) as the very last step, so nothing reinstalls plain
# Pillow over it, and checks PIL.features: a build without one of those codecs
# fails the set-up. Set VLMDATA_NO_SIMD=1 to keep stock Pillow.
set -euo pipefail
VENV="${1:-.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
PYTHON="${PYTHON:-python3}"
here="$(cd "$(dirname "$0")/.." && pwd)"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip setuptools wheel
"${PIP[@]}" install "$TORCH_SPEC"
"${PIP[@]}" install -c "$here/tools/constraints.txt" -e "$here[dali,ray,fast-text,test]"

# Pillow-SIMD is built from source and links only the codecs whose headers are present, so the
# headers come first: Debian's -dev packages, installed with apt-get when run as root.
CODEC_DEBS=(libjpeg-dev zlib1g-dev libpng-dev libwebp-dev libtiff-dev liblcms2-dev libopenjp2-7-dev)
install_codec_headers() {
    local missing=() pkg
    command -v dpkg-query >/dev/null 2>&1 || return 0      # not Debian: the check after the build decides
    for pkg in "${CODEC_DEBS[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing image codec headers for Pillow-SIMD: ${missing[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "warning: codec headers missing and not root: sudo apt-get install -y ${missing[*]}" >&2
    fi
}
codecs_ok() { "$VENV/bin/python" -m vlmdata.decode.codec_support >/dev/null 2>&1; }
is_simd() { "$VENV/bin/python" -c "import PIL, sys; sys.exit(0 if '.post' in PIL.__version__ else 1)" 2>/dev/null; }

# Pillow-SIMD replaces Pillow's PIL package; it must be installed last. An earlier build that lacks a
# codec (built before its headers were installed) is rebuilt.
if [ "${VLMDATA_NO_SIMD:-0}" != "1" ]; then
    if ! is_simd || ! codecs_ok; then
        install_codec_headers
        "${PIP[@]}" uninstall -y pillow pillow-simd >/dev/null 2>&1 || true
        cflags=""
        grep -q avx2 /proc/cpuinfo 2>/dev/null && cflags="-mavx2"
        CC="cc $cflags" "${PIP[@]}" install --no-cache-dir --no-binary pillow-simd "pillow-simd==12.1.1.post0" \
            || { echo "pillow-simd build failed; falling back to stock Pillow" >&2; "${PIP[@]}" install Pillow; }
    fi
else
    "${PIP[@]}" install Pillow
fi
# Fail loudly when the PIL now installed cannot decode WebP, TIFF, JPEG 2000 or convert LAB/ICC images.
"$VENV/bin/python" -m vlmdata.decode.codec_support || { echo "set-up failed: see the line above" >&2; exit 1; }
"$VENV/bin/python" -c "import PIL, torch, vlmdata; print('env ready: PIL', PIL.__version__, '| torch', torch.__version__)"
