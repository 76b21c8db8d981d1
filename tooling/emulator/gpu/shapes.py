"""Model shapes for a step measurement: from a Hugging Face config.json, or by name.

A step's time depends on a model's shapes, not on its weights' values, so
`specroute gpu measure` needs only these numbers: hidden size, layers, attention
heads and KV heads, head size, MLP width, vocabulary, and for an EAGLE-3 head its
fused-features input (3 x hidden). They are the keys measured/measure_steps.py reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Shape = dict[str, Any]

# The shapes the H200 runs measured (measured/measure_steps.py), by the names there.
NAMED: dict[str, Shape] = {
    "llama-3.1-8b": dict(
        hidden=4096, layers=32, heads=32, kv=8, hd=128, inter=14336, vocab=128256, fc=0
    ),
    "llama-3.2-1b": dict(
        hidden=2048, layers=16, heads=32, kv=8, hd=64, inter=8192, vocab=128256, fc=0
    ),
    "eagle3-head-8b": dict(
        hidden=4096, layers=1, heads=32, kv=8, hd=128, inter=14336, vocab=32000, fc=3
    ),
    "qwen3-32b": dict(
        hidden=5120, layers=64, heads=64, kv=8, hd=128, inter=25600, vocab=151936, fc=0
    ),
}
NGRAM = "ngram"


def shape_from_config(path: Path) -> Shape:
    """The shape a config.json describes (a folder: its config.json). An EAGLE-3 head
    (architectures *Eagle3*) gets its 3*hidden->hidden fc and its draft vocabulary."""
    file = path / "config.json" if path.is_dir() else path
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"model config {file}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"model config {file}: not JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"model config {file}: want a JSON object")
    text = raw.get("text_config", raw)  # a multimodal model's language part
    need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    missing = [k for k in (*need, "vocab_size") if k not in text and k not in raw]
    if missing:
        raise ValueError(f"model config {file}: no {', '.join(missing)} (a decoder's config.json?)")
    eagle3 = any("eagle3" in str(a).lower() for a in raw.get("architectures") or ())
    heads = int(text["num_attention_heads"])
    return {
        "hidden": int(text["hidden_size"]),
        "layers": int(text["num_hidden_layers"]),
        "heads": heads,
        "kv": int(text.get("num_key_value_heads") or heads),
        "hd": int(text.get("head_dim") or int(text["hidden_size"]) // heads),
        "inter": int(text["intermediate_size"]),
        "vocab": int(raw.get("draft_vocab_size") or text.get("vocab_size") or raw["vocab_size"]),
        "fc": 3 if eagle3 else 0,
    }


def model_shape(source: str) -> Shape:
    """A named shape, or a config.json (or its folder) by path."""
    if source in NAMED:
        return dict(NAMED[source])
    path = Path(source)
    if not path.exists():
        raise ValueError(
            f"{source!r}: neither a config.json (or a folder holding one) nor a named shape "
            f"({', '.join(NAMED)})"
        )
    return shape_from_config(path)


@dataclass(frozen=True, slots=True)
class DrafterChoice:
    """One --drafter: its name in the profile, vLLM's method, and its shape (None: n-gram)."""

    name: str
    method: str
    shape: Shape | None
    source: str

    @classmethod
    def parse(cls, text: str) -> DrafterChoice:
        """NAME=SOURCE (a config.json, its folder, or a named shape), or ngram / NAME=ngram."""
        name, sep, source = text.partition("=")
        name, source = name.strip(), (source.strip() if sep else name.strip())
        if not name or not source:
            raise ValueError(f"--drafter {text!r}: want NAME=CONFIG_OR_SHAPE, or ngram")
        if source == NGRAM:
            return cls(name, "ngram", None, NGRAM)
        if not sep:
            raise ValueError(f"--drafter {text!r}: want NAME=CONFIG_OR_SHAPE (e.g. draft=./1b/)")
        shape = model_shape(source)
        return cls(name, "eagle3" if shape["fc"] else "draft_model", shape, source)

    def setup(self) -> dict[str, Any]:
        """Its entry in the measurement's SHAPES spec (and the run's setup line)."""
        if self.shape is None:
            what = "n-gram prompt lookup: no model pass (its CPU lookup is not measured)"
            return {"drafter": self.name, "method": self.method, "what": what}
        kind = "an EAGLE-3 head" if self.method == "eagle3" else "a separate draft model"
        what = f"{kind}, the shape of {self.source} ({self.shape['layers']} layers)"
        return {
            "drafter": self.name,
            "method": self.method,
            "what": what,
            "name": f"drafter-{self.name}",
            "source": self.source,
            **self.shape,
        }
