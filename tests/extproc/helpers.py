"""What the Envoy tests read in an answer: its SSE events, its usage chunks (what they
send, and the metrics they read, are tooling/envoy.py's `chat` and `metric`)."""

from __future__ import annotations

import json
from typing import Any


def events(text: str) -> list[str]:
    """The data of each SSE event, in order."""
    return [e.removeprefix("data: ") for e in text.split("\n\n") if e.startswith("data: ")]


def usage_chunks(text: str) -> list[dict[str, Any]]:
    out = []
    for data in events(text):
        if data != "[DONE]" and (chunk := json.loads(data)).get("usage") and not chunk["choices"]:
            out.append(chunk)
    return out
