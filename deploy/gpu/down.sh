#!/usr/bin/env bash
# Stop the vLLM servers started by deploy/gpu/launch.sh (SIGTERM, then SIGKILL
# after the grace period, 30 s by default: vLLM frees GPU memory on a clean exit).
#
#   deploy/gpu/down.sh [--run-dir DIR] [--grace S]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$here/../stop_pair.sh" --run-dir ./run --grace 30 "$@"
