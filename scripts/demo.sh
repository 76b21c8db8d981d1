#!/usr/bin/env bash
# The main job on an embedded default, no GPU: sets up .venv, then runs
# `specroute demo` (two EMULATED vLLM backends + the gateway, a short mixed workload).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
exec .venv/bin/specroute demo "$@"
