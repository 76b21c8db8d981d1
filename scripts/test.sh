#!/usr/bin/env bash
# The one test command (README, .ci/run): sets up .venv from pyproject.toml,
# then lint, types, the unit/integration suite, and the real-vLLM tier.
#
#   SPECROUTE_SKIP_VLLM=1 bash scripts/test.sh   # skip the real-engine tier (local quick run)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest (gateway, classifier, emulator)"
.venv/bin/pytest -m "not vllm" -q

if [[ "${SPECROUTE_SKIP_VLLM:-0}" == "1" ]]; then
    echo "== real-vLLM tier SKIPPED (SPECROUTE_SKIP_VLLM=1)"
    exit 0
fi
echo "== real-vLLM tier (deploy/cpu)"
bash scripts/test_vllm.sh
