#!/usr/bin/env bash
# The real-engine tier: start the CPU vLLM pair (deploy/cpu/up.sh), run the
# tests marked `vllm` against it through the gateway, stop the pair.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

started=$(date +%s)
trap 'bash deploy/cpu/down.sh >&2 || true' EXIT
if ! backends=$(bash deploy/cpu/up.sh); then
    echo "!!! the CPU vLLM pair did not start: see the log above" >&2
    exit 1
fi
echo "vLLM pair up after $(( $(date +%s) - started )) s: $(echo "$backends" | tr '\n' ' ')"
SPECROUTE_VLLM_BACKENDS=$(echo "$backends" | paste -sd, -) \
    .venv/bin/pytest -m vllm -q
echo "real-vLLM tier took $(( $(date +%s) - started )) s"
