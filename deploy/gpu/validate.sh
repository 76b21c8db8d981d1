#!/usr/bin/env bash
# The GPU check: start the vLLM servers (the pair, or one per --route) on the
# GPU(s), put the gateway in front, run `specroute bench` on the built-in mix at
# concurrency 1 and 16 through every route's server and the gateway, and keep
# everything (bench JSON + plot, logs, metric scrapes, versions) in one folder.
#
#   deploy/gpu/validate.sh --model DIR [--draft DIR] [--out DIR]
#       [--workload mixed] [--concurrency 1,16] [--gateway-port P]
#       [--budget S] [LAUNCH_OPTIONS...]
#
# LAUNCH_OPTIONS go to deploy/gpu/launch.sh unchanged (--route none --route
# ngram:2 ..., --gpus, --spec, --spec-port, --base-port, --gpu-mib,
# --max-model-len, `-- EXTRA_VLLM_ARGS`, ...).
# Needs: a GPU, vLLM (GPU build) on PATH or in $VLLM, the model folders on
# local disk, specroute installed (`specroute` on PATH, $SPECROUTE, or the
# repo's .venv). Uses no network (HF_HUB_OFFLINE=1).
#
# Wall time: at most --budget seconds (default 570, inside 10 minutes). Each
# server gets at most a third of it to become ready, the bench gets the rest
# minus a minute for scrapes and shutdown. Exit status: the bench's (124 if
# it ran out of time), or non-zero if a server or the gateway did not start.
#
# The bench interface it uses (written before `specroute bench` existed):
#   specroute bench --target baseline=URL --target speculative=URL
#       --target gateway=URL --workload mixed --concurrency 1,16
#   (one --target NAME=URL per route, in launch.sh's order, then the gateway)
#       --json OUT/bench.json --plot OUT/bench.png
# Extra bench flags: BENCH_ARGS="..." in the environment.
#
# Output folder (default ./validate-YYYYmmdd-HHMMSS):
#   bench.json bench.png bench.log   the bench's results and its output
#   summary.txt                      what ran, timings, exit codes
#   env.txt                          nvidia-smi, vLLM and specroute versions
#   launch.log run/*.log             launch.sh (with the memory split) and vLLM logs
#   run/gateway.toml gateway.log     the gateway's [routes.*] config, its JSON log
#   metrics/{before,after}-*.txt     /metrics of the gateway and each route's server
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

out=""
workload="mixed"
concurrency="1,16"
gateway_port=8080
budget=570
launch_args=()
user_timeout=0

usage() { sed -n '2,36p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; }
die() { printf '[validate] ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf '[validate %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) out="${2:?--out needs a value}"; shift 2 ;;
        --workload) workload="${2:?--workload needs a value}"; shift 2 ;;
        --concurrency) concurrency="${2:?--concurrency needs a value}"; shift 2 ;;
        --gateway-port) gateway_port="${2:?--gateway-port needs a value}"; shift 2 ;;
        --budget) budget="${2:?--budget needs a value}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        --timeout) user_timeout=1; launch_args+=("$1" "${2:?}"); shift 2 ;;
        --) launch_args+=("$@"); break ;;
        *) launch_args+=("$1"); shift ;;
    esac
done
if ! [[ "$budget" =~ ^[0-9]+$ ]] || (( budget < 60 )); then die "--budget must be >= 60 seconds"; fi
[[ "$gateway_port" =~ ^[0-9]+$ ]] || die "--gateway-port must be a number"

if [[ -n "${SPECROUTE:-}" ]]; then
    read -r -a specroute_cmd <<<"$SPECROUTE"
elif command -v specroute >/dev/null; then
    specroute_cmd=(specroute)
elif [[ -x "$repo/.venv/bin/specroute" ]]; then
    specroute_cmd=("$repo/.venv/bin/specroute")
else
    die "specroute not found: install it (pip install -e . -e ./tooling: bench is specroute-tools) or set SPECROUTE"
fi
read -r -a vllm_cmd <<<"${VLLM:-vllm}"

out="${out:-./validate-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out/metrics"
out="$(cd "$out" && pwd)"
t_start=$SECONDS
deadline=$((t_start + budget))
summary="$out/summary.txt"
note() { printf '%s\n' "$*" | tee -a "$summary" >&2; }
: >"$summary"

gateway_pid=""
# shellcheck disable=SC2317  # runs from the EXIT trap
teardown() {
    local rc=$?
    set +e
    if [[ -n "$gateway_pid" ]] && kill -0 "$gateway_pid" 2>/dev/null; then
        kill -TERM "$gateway_pid"
        wait "$gateway_pid" 2>/dev/null
    fi
    bash "$here/down.sh" --run-dir "$out/run" --grace 20 >>"$out/launch.log" 2>&1
    note "total wall time: $((SECONDS - t_start)) s; exit status $rc"
    exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

note "specroute GPU check $(date -u +%Y-%m-%dT%H:%M:%SZ), output in $out"
{
    echo "## nvidia-smi"
    nvidia-smi 2>&1 || echo "nvidia-smi not available"
    echo "## vllm --version"
    "${vllm_cmd[@]}" --version 2>&1 || echo "vllm --version failed"
    echo "## specroute"
    git -C "$repo" rev-parse HEAD 2>/dev/null || echo "not a git checkout"
    echo "## launch options"
    printf '%q ' "${launch_args[@]}"
    echo
} >"$out/env.txt" 2>&1

# 1. The servers (staggered start inside launch.sh).
server_timeout=$((budget / 3))
(( user_timeout )) || launch_args+=(--timeout "$server_timeout")
log "starting the vLLM servers (launch.log)"
t0=$SECONDS
if ! bash "$here/launch.sh" --run-dir "$out/run" "${launch_args[@]}" \
        >"$out/backends.txt" 2>"$out/launch.log"; then
    tail -n 60 "$out/launch.log" >&2
    die "the vLLM servers did not start (see $out/launch.log)"
fi
note "servers ready after $((SECONDS - t0)) s: $(tr '\n' ' ' <"$out/backends.txt")"
routes=() urls=()
while IFS='=' read -r name url; do routes+=("$name"); urls+=("$url"); done <"$out/backends.txt"
(( ${#routes[@]} > 0 )) || die "launch.sh named no route"
gateway_url="http://127.0.0.1:$gateway_port"

# 2. The gateway on launch.sh's [routes.*] config (run from the output folder so
# that no config.toml of the current directory is picked up).
log "starting the gateway on $gateway_url (gateway.log)"
(cd "$out" && exec "${specroute_cmd[@]}" serve --config "$out/run/gateway.toml" \
    --host 127.0.0.1 --port "$gateway_port") \
    >"$out/gateway.log" 2>&1 &
gateway_pid=$!
t0=$SECONDS
until curl -fsS -o /dev/null --max-time 2 "$gateway_url/ready" 2>/dev/null; do
    kill -0 "$gateway_pid" 2>/dev/null || { tail -n 30 "$out/gateway.log" >&2; die "gateway exited"; }
    (( SECONDS - t0 < 60 )) || die "gateway not ready after 60 s"
    sleep 0.5
done
note "gateway ready after $((SECONDS - t0)) s"

scrape() {
    local when=$1 i
    curl -fsS --max-time 5 "$gateway_url/metrics" >"$out/metrics/$when-gateway.txt" 2>/dev/null \
        || log "could not scrape the gateway's /metrics"
    for i in "${!routes[@]}"; do
        curl -fsS --max-time 5 "${urls[$i]}/metrics" >"$out/metrics/$when-${routes[$i]}.txt" \
            2>/dev/null || log "could not scrape ${routes[$i]} /metrics"
    done
}
scrape before

# 3. The bench, in what is left of the budget (a minute kept for the rest).
bench_timeout=$((deadline - SECONDS - 60))
(( bench_timeout >= 30 )) || die "only ${bench_timeout} s left for the bench: raise --budget"
read -r -a bench_extra <<<"${BENCH_ARGS:-}"
targets=()
for i in "${!routes[@]}"; do targets+=(--target "${routes[$i]}=${urls[$i]}"); done
bench=("${specroute_cmd[@]}" bench "${targets[@]}" --target "gateway=$gateway_url"
    --workload "$workload" --concurrency "$concurrency"
    --json "$out/bench.json" --plot "$out/bench.png"
    ${bench_extra[@]+"${bench_extra[@]}"})
note "bench (timeout ${bench_timeout} s): ${bench[*]}"
t0=$SECONDS
bench_rc=0
timeout --signal=INT --kill-after=15 "$bench_timeout" "${bench[@]}" 2>&1 \
    | tee "$out/bench.log" >&2 || bench_rc=${PIPESTATUS[0]}
note "bench finished after $((SECONDS - t0)) s with exit status $bench_rc"
scrape after
for f in bench.json bench.png; do
    if [[ -s "$out/$f" ]]; then note "wrote $out/$f"; else note "MISSING $out/$f"; fi
done
exit "$bench_rc"
