#!/usr/bin/env bash
# Run the whole test suite (called by `make test`): system packages the tests
# need (headless Chromium for the dashboard test), then pytest.
set -euo pipefail
VENV="${1:-.venv}"
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ]; then
        echo "installing Debian's chromium for the dashboard browser test"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
            || echo "warning: could not install chromium; the browser test will fail" >&2
    else
        echo "warning: chromium missing and not root; install it: sudo apt-get install chromium" >&2
    fi
fi
"$VENV/bin/ruff" check vlmdata vlmdata_pipelines tools tests
exec "$VENV/bin/python" -m pytest -q tests
