#!/usr/bin/env bash
# Stop the CPU vLLM servers started by deploy/cpu/up.sh (SIGTERM, then SIGKILL
# after the grace period; no orphans; exits non-zero if a process survives).
#
#   deploy/cpu/down.sh [--run-dir DIR] [--grace S]
#
# deploy/stop_pair.sh stops every server with a pid file in RUN_DIR: the pair,
# the dynamic server and the third route's (up.sh --ngram-k2, ngram-k2.pid).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
run_dir="${SPECROUTE_CACHE:-$HOME/.cache/specroute}/run"
grace=20
while [[ $# -gt 0 ]]; do
    case "$1" in
        --run-dir) run_dir="${2:?--run-dir needs a value}"; shift 2 ;;
        --grace) grace="${2:?--grace needs a value}"; shift 2 ;;
        *) shift ;;
    esac
done
rc=0
bash "$here/../stop_pair.sh" --run-dir "$run_dir" --grace "$grace" || rc=$?
[[ -f "$run_dir/ngram-k2.pid" ]] || rm -f "$run_dir/ngram-k2"
exit "$rc"
