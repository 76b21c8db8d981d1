#!/usr/bin/env bash
# Stop the CPU vLLM pair started by deploy/cpu/up.sh (SIGTERM, then SIGKILL
# after the grace period; no orphans; exits non-zero if a process survives).
#
#   deploy/cpu/down.sh [--run-dir DIR] [--grace S]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$here/../stop_pair.sh" --run-dir "${SPECROUTE_CACHE:-$HOME/.cache/specroute}/run" --grace 20 "$@"
