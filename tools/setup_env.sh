#!/usr/bin/env bash
# Create the project's virtual environment from scratch on a fresh machine.
#   tools/setup_env.sh [VENV_DIR]
# Installs the pinned CPU build of torch (GPU users: set TORCH_SPEC, see README),
# every runtime and test dependency, then swaps stock Pillow for Pillow-SIMD
# (built with AVX2 when the CPU has it) as the very last step, so nothing
# reinstalls plain Pillow over it. Set VLMDATA_NO_SIMD=1 to keep stock Pillow.
set -euo pipefail
VENV="${1:-.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
PYTHON="${PYTHON:-python3}"
here="$(cd "$(dirname "$0")/.." && pwd)"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip setuptools wheel
"${PIP[@]}" install "$TORCH_SPEC"
"${PIP[@]}" install -c "$here/tools/constraints.txt" -e "$here[dali,ray,test]"

# Pillow-SIMD replaces Pillow's PIL package; it must be installed last.
if [ "${VLMDATA_NO_SIMD:-0}" != "1" ]; then
    if ! "$VENV/bin/python" -c "import PIL, sys; sys.exit(0 if '.post' in PIL.__version__ else 1)" 2>/dev/null; then
        "${PIP[@]}" uninstall -y pillow pillow-simd >/dev/null 2>&1 || true
        cflags=""
        grep -q avx2 /proc/cpuinfo 2>/dev/null && cflags="-mavx2"
        CC="cc $cflags" "${PIP[@]}" install --no-cache-dir --no-binary pillow-simd "pillow-simd==12.1.1.post0" \
            || { echo "pillow-simd build failed; falling back to stock Pillow" >&2; "${PIP[@]}" install Pillow; }
    fi
else
    "${PIP[@]}" install Pillow
fi
"$VENV/bin/python" -c "import PIL, torch, vlmdata; print('env ready: PIL', PIL.__version__, '| torch', torch.__version__)"
