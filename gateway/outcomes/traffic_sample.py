"""Record a sample of real requests to JSONL, for `specroute bench --workload FILE`.

Whether speculation pays depends on the traffic, so the best benchmark is the
traffic itself, replayed. The gateway offers each parsed request here (config
`[record]`); a sampled one is queued and, on a background thread, redacted and
handed to an OutcomeLog (the same bounded, rotated JSONL writer as the outcome
log). `offer` only draws a random number and does a non-blocking put: a full
queue drops the record and counts it, so recording never slows a request.

Redaction "placeholders" (the default) replaces every prompt text with
placeholder words of the SAME token count (the gateway's tiktoken counter):
message content and text parts, tool-call arguments, tool descriptions,
completion prompts; token-id prompts keep their length, ids zeroed; the `user`
field is dropped. Everything else (response_format and its schema,
temperature, max_tokens, tools' names and parameters, stream) is kept, so a
replay has the routing features of the original: same prompt tokens,
structured or not, same sampling. A text that looked like code keeps a code
fence (```) inside its count, so code_like survives too; equal texts get
equal placeholders (the words are drawn from a salted hash of the text), so
repeated system prompts and conversation prefixes still share a prefix.
Redaction "off" records bodies verbatim (sensitive!).

One line per request:
    {"t": seconds since the recording started (monotonic clock),
     "ts": unix time of arrival, "endpoint": "chat" | "completions",
     "workload": the router's workload label, "redaction": "placeholders" | "off",
     "body": the request body as redacted}
"""

from __future__ import annotations

import copy
import hashlib
import os
import queue
import random
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from classifier.features import Endpoint, extract_features
from classifier.tokens import TokenCounter
from gateway.outcomes.outcome_log import OutcomeLog

REDACTIONS = ("placeholders", "off")
_STOP = object()
# Neutral words (no code, SQL or creative-writing cue for any classifier);
# those that are not one token in the configured encoding are dropped at start.
_WORDS = (  # noqa: SIM905 - a paragraph reads better than 46 quoted lines
    "alpha river stone paper window market yellow silver orange forest winter summer planet "
    "bridge castle button basket mirror rocket wagon anchor hammer needle ribbon shadow green "
    "table chair water light north south early later small large quiet bright "
    "simple moment number letter school travel garden island"
).split()
_CODE_MARK = "```"


class ExactCounter:
    """Exact token counts from a counter that may estimate long texts.

    The gateway's counter samples texts beyond a few KiB (it runs on every
    request); a placeholder must match the real count, so long texts are
    counted in chunks cut at a space between two letters, where the
    tokenizer's pre-split cuts anyway, and the chunk counts added up.
    """

    CHUNK = 2048

    def __init__(self, counter: TokenCounter) -> None:
        self._count = counter.count

    def count(self, text: str) -> int:
        total, start = 0, 0
        while len(text) - start > self.CHUNK:
            cut = self._cut(text, start + self.CHUNK // 2, start + self.CHUNK)
            total += self._count(text[start:cut])
            start = cut
        return total + self._count(text[start:])

    @staticmethod
    def _cut(text: str, lo: int, hi: int) -> int:
        for i in range(hi - 1, lo, -1):
            if text[i] == " " and text[i - 1].isalpha() and text[i + 1].isalpha():
                return i
        return hi  # no safe cut (one long word?): at most one token off


class Placeholders:
    """Texts -> neutral words with the same token count, checked with the counter."""

    def __init__(self, counter: TokenCounter, salt: bytes | None = None) -> None:
        self._count = ExactCounter(counter).count
        self._salt = os.urandom(16) if salt is None else salt
        self._inner = [w for w in _WORDS if counter.count(" " + w) == 1]
        self._first = [w for w in self._inner if counter.count(w) == 1]
        if len(self._inner) < 8 or not self._first:
            raise ValueError("the tokenizer has too few one-token placeholder words")

    def replace(self, text: str) -> str:
        """A placeholder for `text` with exactly as many tokens (same text, same words)."""
        features = extract_features(
            {"messages": [{"role": "user", "content": text}]}, Endpoint.CHAT, self
        )
        return self.of_length(features.prompt_tokens, self._seed(text), features.code_like)

    def of_length(self, n: int, seed: bytes = b"", code_like: bool = False) -> str:
        if n <= 0:
            return ""
        rng = random.Random(seed)
        words = [rng.choice(self._first)] + [rng.choice(self._inner) for _ in range(n - 1)]
        prefix = f"{_CODE_MARK}\n" if code_like else ""
        text = prefix + " ".join(words)
        for _ in range(8):  # one-token words add up exactly; the prefix may need a trim
            diff = self._count(text) - n
            if diff == 0:
                return text
            if diff > 0 and len(words) > diff:
                del words[len(words) - diff :]
            elif diff < 0:
                words += [rng.choice(self._inner) for _ in range(-diff)]
            else:
                prefix = ""
            text = prefix + " ".join(words)
        return text  # pragma: no cover - a tokenizer that merges across spaces

    def _seed(self, text: str) -> bytes:
        return hashlib.blake2b(text.encode(), key=self._salt, digest_size=16).digest()

    def count(self, text: str) -> int:
        return self._count(text)


def redact_body(body: dict[str, Any], endpoint: str, placeholders: Placeholders) -> dict[str, Any]:
    """A copy of `body` with every prompt text replaced by a same-length placeholder."""
    out = copy.deepcopy(body)
    out.pop("user", None)
    swap = placeholders.replace
    if endpoint == Endpoint.COMPLETIONS.value:
        prompt = out.get("prompt")
        if isinstance(prompt, str):
            out["prompt"] = swap(prompt)
        elif isinstance(prompt, list):
            out["prompt"] = [_redact_prompt_item(p, swap) for p in prompt]
    for message in _dicts(out.get("messages")):
        content = message.get("content")
        if isinstance(content, str):
            message["content"] = swap(content)
        for part in _dicts(content):
            if isinstance(part.get("text"), str):
                part["text"] = swap(part["text"])
        for call in _dicts(message.get("tool_calls")):
            function = call.get("function")
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                function["arguments"] = swap(function["arguments"])
    for tool in _dicts(out.get("tools")):
        function = tool.get("function")
        if isinstance(function, dict) and isinstance(function.get("description"), str):
            function["description"] = swap(function["description"])
    return out


def _redact_prompt_item(item: Any, swap: Any) -> Any:
    if isinstance(item, str):
        return swap(item)
    if isinstance(item, int):
        return 0
    if isinstance(item, list):
        return [0 if isinstance(i, int) else i for i in item]
    return item


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


class _Offered(NamedTuple):
    body: dict[str, Any]
    endpoint: str
    arrived: float
    workload: str


class Recorder:
    """Sampled request bodies -> redacted JSONL lines; `offer` never blocks."""

    def __init__(
        self,
        path: Path,
        counter: TokenCounter,
        *,
        sample_rate: float = 1.0,
        redaction: str = "placeholders",
        max_bytes: int = 64 * 1024 * 1024,
        backups: int = 3,
        queue_size: int = 1000,
        seed: int | None = None,
    ) -> None:
        if redaction not in REDACTIONS:
            raise ValueError(f"redaction must be one of {REDACTIONS}")
        self.redaction = redaction
        self.sample_rate = sample_rate
        self.dropped = 0
        self._rng = random.Random(seed)
        self._placeholders = Placeholders(counter) if redaction == "placeholders" else None
        self._log = OutcomeLog(path, max_bytes=max_bytes, backups=backups)
        self._t0 = time.perf_counter()
        self._ts0 = time.time()
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="specroute-recorder", daemon=True)
        self._thread.start()

    @property
    def written(self) -> int:
        return self._log.written

    def offer(self, body: dict[str, Any], endpoint: str, arrived: float, workload: str) -> None:
        """Maybe record this request; `arrived` is its time.perf_counter() at arrival."""
        if self.sample_rate < 1.0 and self._rng.random() >= self.sample_rate:
            return
        try:
            self._queue.put_nowait(_Offered(body, endpoint, arrived, workload))
        except queue.Full:
            self.dropped += 1

    def close(self) -> None:
        """Redact and write what is queued, then stop both threads."""
        self._queue.put(_STOP)
        self._thread.join(timeout=10)
        self._log.close()

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            assert isinstance(item, _Offered)
            body, endpoint, arrived, workload = item
            offset = arrived - self._t0
            if self._placeholders is not None:
                body = redact_body(body, endpoint, self._placeholders)
            self._log.write(
                {
                    "t": round(offset, 6),
                    "ts": round(self._ts0 + offset, 3),
                    "endpoint": endpoint,
                    "workload": workload,
                    "redaction": self.redaction,
                    "body": body,
                }
            )
