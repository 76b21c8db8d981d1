#!/usr/bin/env bash
# The main job on an embedded default, no GPU: sets up .venv, then runs
# `specroute demo` (two EMULATED vLLM backends + the gateway, a short mixed workload).
# The demo is tooling: specroute-tools (./tooling) is installed beside specroute.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
echo "specroute demo: installing into .venv the first time (docs/testing.md says how long)..." >&2
if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check \
    -e . -e ./tooling >.venv/pip.log 2>&1; then
    cat .venv/pip.log >&2
    exit 1
fi
exec .venv/bin/specroute demo "$@"
