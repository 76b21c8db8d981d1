#!/usr/bin/env bash
# Start vLLM servers of ONE target model under the same --served-model-name, one
# per route (speculation configuration), on one GPU or one per GPU.
#
#   deploy/gpu/launch.sh --model DIR [--draft DIR]
#       --route [NAME=]METHOD[:K][@DRAFT_DIR] [--route ...]   (N routes, deploy/gpu/routes.py)
#       [--port P | --ports P,P,...] [--gpus 0,1,...] [--utils F,F,...]
#   deploy/gpu/launch.sh --model DIR [--draft DIR]            (the two-route pair)
#       [--spec draft|ngram|eagle|eagle3|mtp] [--spec-json JSON] [--num-spec-tokens K]
#       [--spec-port P] [--base-port P] [--spec-util F --base-util F]
#       [--first speculative|baseline]
#   common: [--served-model-name NAME] [--host H] [--gpu-mib N] [--kv-share F]
#       [--max-model-len N] [--spec-metrics summary|detailed] [--run-dir DIR]
#       [--timeout S] [-- EXTRA_VLLM_ARGS...]
#
# Routes: `none`, `ngram:2`, `eagle3:3@/models/eagle3-head`, `draft:4` (--draft's
# folder), `mtp`, `NAME=METHOD...` for another name, `NAME={...}` for a whole
# --speculative-config. Default names: none, ngram-k2, eagle3-k3, draft-k4. The
# i-th route listens on --port + i (default 8001) and runs on GPU i mod (number of
# --gpus): as many GPUs as routes gives one configuration per GPU.
# Without --route, the pair: speculative (--spec, default draft_model with
# --draft, else n-gram; eagle and eagle3 take the EAGLE head as --draft; mtp the
# target's own MTP layers) on --spec-port 8001, baseline on --base-port 8002.
#
# Memory: each server gets --gpu-memory-utilization from sizing.py (weights of
# --model and the drafts measured on disk, GPU memory from nvidia-smi or
# --gpu-mib; the servers of one GPU share it), unless --utils (or --spec-util
# and --base-util) are given.
#
# Staggered start: the servers of one GPU start one after the other, each once
# the previous answers /v1/models (vLLM's memory profiling assumes no other
# process changes its GPU memory meanwhile); different GPUs start together.
#
# When all are ready, one line per route goes to stdout (and RUN_DIR/backends):
#   NAME=http://HOST:P
# and RUN_DIR/gateway.toml holds the gateway's [routes.NAME] tables
# (`specroute serve --config RUN_DIR/gateway.toml`). Everything else goes to
# stderr; logs (NAME.log) and pid files are in RUN_DIR (default ./run). Stop
# with deploy/gpu/down.sh --run-dir DIR. On failure the failing server's log
# tail is printed and whatever was started is stopped.
#
# Environment: VLLM (the vllm command, default `vllm`), CUDA_VISIBLE_DEVICES
# (the default --gpus, else 0), PYTHON (for sizing, default python3). No network
# is used: HF_HUB_OFFLINE=1 and the model folders must be local.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../pair_lib.sh
source "$here/../pair_lib.sh"

model=""
draft=""
routes=()
port=8001
ports_list=""
gpus="${CUDA_VISIBLE_DEVICES:-0}"
utils=""
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

usage() { sed -n '2,45p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; }
die() { printf '[launch] ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf '[launch %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) model="${2:?--model needs a value}"; shift 2 ;;
        --draft) draft="${2:?--draft needs a value}"; shift 2 ;;
        --route) routes+=("${2:?--route needs a value}"); shift 2 ;;
        --port) port="${2:?--port needs a value}"; shift 2 ;;
        --ports) ports_list="${2:?--ports needs a value}"; shift 2 ;;
        --gpus) gpus="${2:?--gpus needs a value}"; shift 2 ;;
        --utils) utils="${2:?--utils needs a value}"; shift 2 ;;
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

[[ -n "$model" ]] || { usage; die "--model DIR is required"; }
[[ -d "$model" ]] || die "--model $model: not a directory (weights must be local)"
[[ -z "$draft" || -d "$draft" ]] || die "--draft $draft: not a directory"
[[ "$timeout_s" =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds"
[[ "$spec_metrics" == summary || "$spec_metrics" == detailed ]] \
    || die "--spec-metrics must be summary or detailed"
model="$(cd "$model" && pwd)"
[[ -z "$draft" ]] || draft="$(cd "$draft" && pwd)"
[[ -n "$served_name" ]] || served_name="$(basename "$model")"

# The routes, as deploy/gpu/routes.py reads them. Without --route: the pair.
plan_args=(--host "$host" --gpus "$gpus" --kv-share "$kv_share")
if (( ${#routes[@]} == 0 )); then
    [[ "$spec_port" =~ ^[0-9]+$ && "$base_port" =~ ^[0-9]+$ ]] || die "ports must be numbers"
    [[ "$spec_port" != "$base_port" ]] || die "--spec-port and --base-port must differ"
    [[ "$first" == speculative || "$first" == baseline ]] \
        || die "--first must be speculative or baseline"
    [[ -n "$spec" ]] || { if [[ -n "$draft" ]]; then spec="draft"; else spec="ngram"; fi; }
    case "$spec" in
        draft|ngram|eagle|eagle3|mtp) ;;
        *) die "--spec must be draft, ngram, eagle, eagle3 or mtp, not '$spec'" ;;
    esac
    if [[ -n "$spec_json" ]]; then
        speculative="speculative=$spec_json"
    else
        speculative="speculative=$spec${num_spec_tokens:+:$num_spec_tokens}"
    fi
    if [[ -n "$spec_util" || -n "$base_util" ]]; then
        [[ -n "$spec_util" && -n "$base_util" ]] || die "give both --spec-util and --base-util"
    fi
    if [[ "$first" == speculative ]]; then
        routes=("$speculative" baseline=none)
        plan_args+=(--ports "$spec_port,$base_port")
        [[ -z "$spec_util" ]] || utils="$spec_util,$base_util"
    else
        routes=(baseline=none "$speculative")
        plan_args+=(--ports "$base_port,$spec_port")
        [[ -z "$spec_util" ]] || utils="$base_util,$spec_util"
    fi
elif [[ -n "$ports_list" ]]; then
    plan_args+=(--ports "$ports_list")
else
    [[ "$port" =~ ^[0-9]+$ ]] || die "--port must be a number"
    plan_args+=(--port "$port")
fi
for route in "${routes[@]}"; do plan_args+=(--route "$route"); done
[[ -z "$draft" ]] || plan_args+=(--draft "$draft")

# Memory split.
if [[ -n "$utils" ]]; then
    plan_args+=(--utils "$utils")
    log "memory split given: $utils"
else
    if [[ -z "$gpu_mib" ]]; then
        command -v nvidia-smi >/dev/null || die "nvidia-smi not found: pass --gpu-mib or --utils"
        gpu_mib="$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits \
            -i "${gpus%%,*}" | head -n 1 | tr -d ' ')"
    fi
    plan_args+=(--model "$model" --gpu-mib "$gpu_mib")
fi
routes_py=("$python_bin" "$here/routes.py" "${plan_args[@]}")
"${routes_py[@]}" --format table >&2 || die "the routes cannot be started (see above)"
plan="$("${routes_py[@]}" --format plan)" || die "routes.py gave no plan"
toml="$("${routes_py[@]}" --format toml)" || die "routes.py gave no gateway config"

names=() ports=() gpu_of=() waves=() util_of=() configs=()
while IFS=$'\t' read -r name p gpu wave util config; do
    names+=("$name"); ports+=("$p"); gpu_of+=("$gpu"); waves+=("$wave")
    util_of+=("$util"); configs+=("$config")
done <<<"$plan"
(( ${#names[@]} > 0 )) || die "routes.py gave no plan"

mkdir -p "$run_dir"
run_dir="$(cd "$run_dir" && pwd)"
if compgen -G "$run_dir/*.pid" >/dev/null; then
    log "stopping the previous servers in $run_dir"
    bash "$here/down.sh" --run-dir "$run_dir"
fi
port_in_use() { (exec 3<>"/dev/tcp/$host/$1") 2>/dev/null; }
for p in "${ports[@]}"; do
    if port_in_use "$p"; then die "port $p on $host is already in use"; fi
done
rm -f "$run_dir/backends" "$run_dir/gateway.toml"

started=()
trap cleanup_on_error EXIT
trap 'exit 130' INT TERM

# start I: route I's server runs in its own session (process group = its pid)
# so down.sh stops the API server and its engine.
start() {
    local i=$1
    local name=${names[$i]} logf="$run_dir/${names[$i]}.log" pidf="$run_dir/${names[$i]}.pid"
    local args=(serve "$model" --served-model-name "$served_name"
        --host "$host" --port "${ports[$i]}" --gpu-memory-utilization "${util_of[$i]}")
    [[ -n "$max_model_len" ]] && args+=(--max-model-len "$max_model_len")
    if [[ -n "${configs[$i]}" ]]; then
        log "$name config: ${configs[$i]}"
        args+=(--speculative-config "${configs[$i]}"
            --per-request-spec-decode-metrics "$spec_metrics")
    fi
    : >"$logf"
    rm -f "$pidf"
    log "starting $name on $host:${ports[$i]}, GPU ${gpu_of[$i]}" \
        "(gpu-memory-utilization ${util_of[$i]}), log $logf"
    # shellcheck disable=SC2016  # $$ and $0 expand in the child bash
    env \
        CUDA_VISIBLE_DEVICES="${gpu_of[$i]}" \
        HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
        VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1 \
        VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 \
        setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidf" \
        "${vllm_cmd[@]}" "${args[@]}" ${extra_args[@]+"${extra_args[@]}"} \
        </dev/null >>"$logf" 2>&1 &
    started+=("$name")
}

# Wave by wave: the w-th server of every GPU together, then wait for them all.
wave=0
while true; do
    batch=()
    for i in "${!names[@]}"; do [[ "${waves[$i]}" == "$wave" ]] && batch+=("$i"); done
    (( ${#batch[@]} > 0 )) || break
    for i in "${batch[@]}"; do start "$i"; done
    for i in "${batch[@]}"; do wait_ready "${names[$i]}" "http://$host:${ports[$i]}" 0.5; done
    wave=$((wave + 1))
done

printf '%s\n' "$toml" >"$run_dir/gateway.toml"
for i in "${!names[@]}"; do printf '%s=http://%s:%s\n' "${names[$i]}" "$host" "${ports[$i]}"; done \
    | tee "$run_dir/backends"
