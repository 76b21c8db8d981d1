#!/usr/bin/env bash
# Start the vLLM pair on ONE GPU: two servers with the same target model under
# the same --served-model-name, one with speculative decoding, one without.
#
#   deploy/gpu/launch.sh --model DIR [--draft DIR]
#       [--spec draft|ngram|eagle|eagle3|mtp] [--spec-json JSON] [--num-spec-tokens K]
#       [--served-model-name NAME] [--host H] [--spec-port P] [--base-port P]
#       [--gpu-mib N] [--spec-util F --base-util F] [--kv-share F]
#       [--max-model-len N] [--spec-metrics summary|detailed]
#       [--first speculative|baseline] [--run-dir DIR] [--timeout S]
#       [-- EXTRA_VLLM_ARGS...]
#
# --spec defaults to draft_model when --draft is given, else n-gram. eagle and
# eagle3 take the EAGLE head's folder as --draft; mtp uses the target's own
# multi-token-prediction layers (DeepSeek-V3, Qwen3-Next, GLM-4.5, MiMo...).
# --spec-json passes a whole --speculative-config instead.
#
# Memory: each server gets --gpu-memory-utilization from sizing.py (weights of
# --model and --draft measured on disk, GPU memory from nvidia-smi or
# --gpu-mib), unless --spec-util and --base-util are given.
#
# Staggered start: the first server (default: speculative, the larger one)
# must answer /v1/models before the second one starts; vLLM's memory profiling
# assumes no other process changes its GPU memory meanwhile.
#
# When both are ready, exactly two lines go to stdout (and RUN_DIR/backends):
#   speculative=http://HOST:P
#   baseline=http://HOST:P
# Everything else goes to stderr; logs and pid files are in RUN_DIR (default
# ./run). Stop with deploy/gpu/down.sh --run-dir DIR. On failure the failing
# server's log tail is printed and whatever was started is stopped.
#
# Environment: VLLM (the vllm command, default `vllm`), CUDA_VISIBLE_DEVICES
# (default 0), PYTHON (for sizing.py, default python3). No network is used:
# HF_HUB_OFFLINE=1 and the model folders must be local.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../pair_lib.sh
source "$here/../pair_lib.sh"

model=""
draft=""
spec=""
spec_json=""
num_spec_tokens=""
served_name=""
host="127.0.0.1"
spec_port=8001
base_port=8002
gpu_mib=""
spec_util=""
base_util=""
kv_share="0.4"
max_model_len=""
spec_metrics="detailed"
first="speculative"
run_dir="./run"
timeout_s=600
extra_args=()

usage() { sed -n '2,36p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; }
die() { printf '[launch] ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf '[launch %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) model="${2:?--model needs a value}"; shift 2 ;;
        --draft) draft="${2:?--draft needs a value}"; shift 2 ;;
        --spec) spec="${2:?--spec needs a value}"; shift 2 ;;
        --spec-json) spec_json="${2:?--spec-json needs a value}"; shift 2 ;;
        --num-spec-tokens) num_spec_tokens="${2:?--num-spec-tokens needs a value}"; shift 2 ;;
        --served-model-name) served_name="${2:?--served-model-name needs a value}"; shift 2 ;;
        --host) host="${2:?--host needs a value}"; shift 2 ;;
        --spec-port) spec_port="${2:?--spec-port needs a value}"; shift 2 ;;
        --base-port) base_port="${2:?--base-port needs a value}"; shift 2 ;;
        --gpu-mib) gpu_mib="${2:?--gpu-mib needs a value}"; shift 2 ;;
        --spec-util) spec_util="${2:?--spec-util needs a value}"; shift 2 ;;
        --base-util) base_util="${2:?--base-util needs a value}"; shift 2 ;;
        --kv-share) kv_share="${2:?--kv-share needs a value}"; shift 2 ;;
        --max-model-len) max_model_len="${2:?--max-model-len needs a value}"; shift 2 ;;
        --spec-metrics) spec_metrics="${2:?--spec-metrics needs a value}"; shift 2 ;;
        --first) first="${2:?--first needs a value}"; shift 2 ;;
        --run-dir) run_dir="${2:?--run-dir needs a value}"; shift 2 ;;
        --timeout) timeout_s="${2:?--timeout needs a value}"; shift 2 ;;
        --) shift; extra_args=("$@"); break ;;
        -h|--help) usage; exit 0 ;;
        *) usage; die "unknown argument: $1" ;;
    esac
done

read -r -a vllm_cmd <<<"${VLLM:-vllm}"
python_bin="${PYTHON:-python3}"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"

[[ -n "$model" ]] || { usage; die "--model DIR is required"; }
[[ -d "$model" ]] || die "--model $model: not a directory (weights must be local)"
[[ -z "$draft" || -d "$draft" ]] || die "--draft $draft: not a directory"
[[ "$spec_port" =~ ^[0-9]+$ && "$base_port" =~ ^[0-9]+$ ]] || die "ports must be numbers"
[[ "$spec_port" != "$base_port" ]] || die "--spec-port and --base-port must differ"
[[ "$timeout_s" =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds"
[[ "$spec_metrics" == summary || "$spec_metrics" == detailed ]] \
    || die "--spec-metrics must be summary or detailed"
[[ "$first" == speculative || "$first" == baseline ]] \
    || die "--first must be speculative or baseline"
model="$(cd "$model" && pwd)"
[[ -z "$draft" ]] || draft="$(cd "$draft" && pwd)"
[[ -n "$served_name" ]] || served_name="$(basename "$model")"
[[ -n "$spec" ]] || { if [[ -n "$draft" ]]; then spec="draft"; else spec="ngram"; fi; }

# The speculative config, as JSON for --speculative-config.
k="${num_spec_tokens}"
if [[ -n "$spec_json" ]]; then
    spec_config="$spec_json"
    draft_for_sizing="$draft"
else
    case "$spec" in
        ngram)
            spec_config="{\"method\":\"ngram\",\"num_speculative_tokens\":${k:-4},\"prompt_lookup_max\":4,\"prompt_lookup_min\":2}"
            draft_for_sizing="" ;;
        draft|eagle|eagle3)
            [[ -n "$draft" ]] || die "--spec $spec needs --draft DIR"
            if [[ "$spec" == draft ]]; then
                method="draft_model"; k="${k:-4}"
            else
                method="$spec"; k="${k:-3}"
            fi
            spec_config="{\"method\":\"$method\",\"model\":\"$draft\",\"num_speculative_tokens\":$k}"
            draft_for_sizing="$draft" ;;
        mtp)
            spec_config="{\"method\":\"mtp\",\"num_speculative_tokens\":${k:-1}}"
            draft_for_sizing="" ;;
        *) die "--spec must be draft, ngram, eagle, eagle3 or mtp, not '$spec'" ;;
    esac
fi

# Memory split.
if [[ -n "$spec_util" || -n "$base_util" ]]; then
    [[ -n "$spec_util" && -n "$base_util" ]] || die "give both --spec-util and --base-util"
    log "memory split given: speculative $spec_util, baseline $base_util"
else
    if [[ -z "$gpu_mib" ]]; then
        command -v nvidia-smi >/dev/null || die "nvidia-smi not found: pass --gpu-mib or the utils"
        gpu_mib="$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits \
            -i "${CUDA_VISIBLE_DEVICES%%,*}" | head -n 1 | tr -d ' ')"
    fi
    sizing=("$python_bin" "$here/sizing.py" --gpu-mib "$gpu_mib" --target-dir "$model"
        --speculative-kv-share "$kv_share")
    [[ -n "$draft_for_sizing" ]] && sizing+=(--draft-dir "$draft_for_sizing")
    "${sizing[@]}" --format table >&2 || die "sizing failed (see above)"
    while IFS='=' read -r key value; do
        case "$key" in
            SPEC_GPU_UTIL) spec_util="$value" ;;
            BASE_GPU_UTIL) base_util="$value" ;;
        esac
    done < <("${sizing[@]}" --format shell)
    [[ -n "$spec_util" && -n "$base_util" ]] || die "sizing gave no split"
fi

mkdir -p "$run_dir"
run_dir="$(cd "$run_dir" && pwd)"
if compgen -G "$run_dir/*.pid" >/dev/null; then
    log "stopping the previous pair in $run_dir"
    bash "$here/down.sh" --run-dir "$run_dir"
fi
port_in_use() { (exec 3<>"/dev/tcp/$host/$1") 2>/dev/null; }
for p in "$spec_port" "$base_port"; do
    if port_in_use "$p"; then die "port $p on $host is already in use"; fi
done
rm -f "$run_dir/backends"

started=()
trap cleanup_on_error EXIT
trap 'exit 130' INT TERM

# start NAME PORT UTIL [extra vllm args...]: the server runs in its own session
# (process group = its pid) so down.sh stops the API server and its engine.
start() {
    local name=$1 port=$2 util=$3
    shift 3
    local logf="$run_dir/$name.log" pidf="$run_dir/$name.pid"
    local args=(serve "$model" --served-model-name "$served_name"
        --host "$host" --port "$port" --gpu-memory-utilization "$util")
    [[ -n "$max_model_len" ]] && args+=(--max-model-len "$max_model_len")
    : >"$logf"
    rm -f "$pidf"
    log "starting $name on $host:$port (gpu-memory-utilization $util), log $logf"
    # shellcheck disable=SC2016  # $$ and $0 expand in the child bash
    env \
        HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
        VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1 \
        VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 \
        setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidf" \
        "${vllm_cmd[@]}" "${args[@]}" "$@" ${extra_args[@]+"${extra_args[@]}"} \
        </dev/null >>"$logf" 2>&1 &
    started+=("$name")
}

start_speculative() {
    start speculative "$spec_port" "$spec_util" \
        --speculative-config "$spec_config" \
        --per-request-spec-decode-metrics "$spec_metrics"
    wait_ready speculative "http://$host:$spec_port" 0.5
}
start_baseline() {
    start baseline "$base_port" "$base_util"
    wait_ready baseline "http://$host:$base_port" 0.5
}

log "speculative config: $spec_config"
if [[ "$first" == speculative ]]; then
    start_speculative
    start_baseline
else
    start_baseline
    start_speculative
fi

printf 'speculative=http://%s:%s\nbaseline=http://%s:%s\n' "$host" "$spec_port" "$host" "$base_port" \
    | tee "$run_dir/backends"
