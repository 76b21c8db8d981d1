"""Request body -> RequestFeatures: the few facts the router decides on.

Runs on every request, so it reads only the fields it needs, counts tokens
once per text and never raises on odd-but-valid bodies (the gateway has
already checked the types; anything unexpected here is simply ignored).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from classifier.targets import LatencyTargets
from classifier.tokens import TokenCounter

__all__ = ["Endpoint", "FeatureOptions", "RequestFeatures", "Workload", "extract_features"]

# vLLM's /v1/completions defaults max_tokens to 16 (OpenAI's legacy default);
# a guess above that would overstate the output of every such request.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

_GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_grammar", "guided_choice")
# vLLM's structured_outputs constraints (its other keys are options, not constraints).
_STRUCTURED_OUTPUT_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")

# Cheap markers of code, SQL or JSON, linear on any input. Each pattern starts
# with a literal, so `re` skips ahead at C speed; a leading \b or one big
# alternation would try every position and cost milliseconds on a long prompt.
# Work on the event loop is bounded per request, whatever the body (a few ms
# at most): about 1 ms of tiktoken, and code markers looked for in 64k chars.
_COUNT_BUDGET_CHARS = 8192
_CHARS_PER_TOKEN = 4.0  # cl100k on English, when nothing could be counted
_SCAN_BUDGET_CHARS = 65536
_CODE_LITERALS = ("```", "CREATE TABLE", "create table")
_CODE_PATTERNS = tuple(
    re.compile(p)
    for p in (
        r"def \w+\s*\(",
        r"class \w+\s*[:({]",
        r"function\s*\w*\s*\([^)]{0,200}\)\s*\{",
        r'\{\s*"[^"\n]{1,80}"\s*:',
    )
)


class Workload(StrEnum):
    """Kind of request; a small fixed set because it is a Prometheus label."""

    STRUCTURED = "structured"
    CODE = "code"
    CREATIVE = "creative"
    LONG_CONTEXT = "long_context"
    CHAT = "chat"


class Endpoint(StrEnum):
    CHAT = "chat"
    COMPLETIONS = "completions"
    RESPONSES = "responses"  # OpenAI's Responses API (/v1/responses)


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    endpoint: Endpoint
    structured: bool
    temperature: float
    top_p: float | None
    prompt_tokens: int
    max_tokens: int | None
    expected_output_tokens: int
    stream: bool
    n: int
    code_like: bool
    workload: Workload
    # The request's latency targets (its llm-d SLO headers, or its model's configured
    # default; classifier/targets.py): None, the cheapest route as before. Not from the
    # body: the gateway sets it after extract_features.
    targets: LatencyTargets | None = None


@dataclass(frozen=True, slots=True)
class FeatureOptions:
    """What a request that does not say gets, and where the workload thresholds lie."""

    default_temperature: float = 1.0  # what the backend applies when a request gives none
    default_output_tokens: int = 256  # expected answer length without max_tokens
    long_prompt_tokens: int = 2048  # prompts at least this long are long_context
    creative_min_temperature: float = 1.0  # an explicit temperature from here on is creative


def extract_features(
    body: Mapping[str, Any],
    endpoint: Endpoint,
    counter: TokenCounter,
    options: FeatureOptions = FeatureOptions(),
) -> RequestFeatures:
    """Extract the routing features of one already-validated request body.

    prompt_tokens sums the counts of each prompt text (message content and text
    parts, tool-call arguments; completion prompts, token-id lists by length; a
    Responses request's instructions and input items);
    chat-template and tool-schema tokens are left out: the counter is cl100k,
    not the served model's tokenizer, so this is an estimate either way.
    Without max_tokens a completions request is capped at vLLM's default 16.

    The workload is the first that applies: structured; long_context
    (prompt_tokens >= options.long_prompt_tokens); code; creative; chat.
    Creative needs a temperature the client set explicitly at or above
    options.creative_min_temperature: a request that leaves temperature out gets the
    server's default (often 1.0), which says nothing about the task.
    """
    texts = list(_TEXTS[endpoint](body))
    prompt_tokens = _token_ids_len(body) if endpoint is Endpoint.COMPLETIONS else 0
    prompt_tokens += _count_bounded(texts, counter)
    code_like = any(_is_code_like(t) for t in _bounded(texts, _SCAN_BUDGET_CHARS))

    raw_temperature = _number(body.get("temperature"))
    temperature = float(options.default_temperature) if raw_temperature is None else raw_temperature
    max_tokens = _int(body.get("max_completion_tokens"))
    if max_tokens is None:
        max_tokens = _int(body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = _int(body.get("max_output_tokens"))  # the Responses API's name
    if max_tokens is not None:
        expected = max(0, max_tokens)
    elif endpoint is Endpoint.COMPLETIONS:
        expected = min(options.default_output_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS)
    else:
        expected = options.default_output_tokens
    n = _int(body.get("n"))
    structured = _is_structured(body)

    if structured:
        workload = Workload.STRUCTURED
    elif prompt_tokens >= options.long_prompt_tokens:
        workload = Workload.LONG_CONTEXT
    elif code_like:
        workload = Workload.CODE
    elif raw_temperature is not None and raw_temperature >= options.creative_min_temperature:
        workload = Workload.CREATIVE
    else:
        workload = Workload.CHAT

    return RequestFeatures(
        endpoint=endpoint,
        structured=structured,
        temperature=temperature,
        top_p=_number(body.get("top_p")),
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        expected_output_tokens=expected,
        stream=body.get("stream") is True,
        n=n if n is not None and n >= 1 else 1,
        code_like=code_like,
        workload=workload,
    )


def _is_structured(body: Mapping[str, Any]) -> bool:
    """Constrained output: response_format (the Responses API's text.format), vLLM
    guided_*/structured_outputs, or tools."""
    text = body.get("text")
    text_format = text.get("format") if isinstance(text, Mapping) else None
    formats = (body.get("response_format"), text_format)
    for response_format in formats:
        if isinstance(response_format, Mapping):
            kind = response_format.get("type")
            if isinstance(kind, str) and kind != "text":
                return True
    if any(body.get(name) is not None for name in _GUIDED_FIELDS):
        return True
    outputs = body.get("structured_outputs")
    if isinstance(outputs, Mapping) and any(
        outputs.get(kind) not in (None, False) for kind in _STRUCTURED_OUTPUT_KINDS
    ):
        return True
    tools = body.get("tools")
    return isinstance(tools, list) and bool(tools) and body.get("tool_choice") != "none"


def _chat_texts(body: Mapping[str, Any]) -> Iterator[str]:
    """Every prompt string of a chat request: text content parts and tool-call arguments."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        yield from _content_texts(message.get("content"), _CHAT_TEXT_PARTS)
        tool_calls = message.get("tool_calls")
        if isinstance(tool_calls, list):
            for call in tool_calls:
                function = call.get("function") if isinstance(call, Mapping) else None
                if isinstance(function, Mapping):
                    arguments = function.get("arguments")
                    if isinstance(arguments, str):
                        yield arguments


def _responses_texts(body: Mapping[str, Any]) -> Iterator[str]:
    """Every prompt string of a Responses request: its instructions, then its input (a
    string, or items: messages with string or text-part content, function calls'
    arguments and their outputs)."""
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        yield instructions
    items = body.get("input")
    if isinstance(items, str):
        yield items
        return
    if not isinstance(items, list):
        return
    for item in items:
        if not isinstance(item, Mapping):
            continue
        yield from _content_texts(item.get("content"), _RESPONSES_TEXT_PARTS)
        for name in ("arguments", "output"):  # function_call, function_call_output
            value = item.get(name)
            if isinstance(value, str):
                yield value


_CHAT_TEXT_PARTS = ("text",)
_RESPONSES_TEXT_PARTS = ("input_text", "output_text")


def _content_texts(content: object, kinds: tuple[str, ...]) -> Iterator[str]:
    """A message's content: a string, or parts of which those of `kinds` hold text."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and part.get("type") in kinds:
                text = part.get("text")
                if isinstance(text, str):
                    yield text


def _prompt_texts(body: Mapping[str, Any]) -> Iterator[str]:
    """The text prompts of a completions request (str or list of str)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        yield prompt
    elif isinstance(prompt, list):
        yield from (p for p in prompt if isinstance(p, str))


_TEXTS = {
    Endpoint.CHAT: _chat_texts,
    Endpoint.COMPLETIONS: _prompt_texts,
    Endpoint.RESPONSES: _responses_texts,
}


def _token_ids_len(body: Mapping[str, Any]) -> int:
    """Tokens of a completions prompt given as token ids (list of int, or of lists)."""
    prompt = body.get("prompt")
    if not isinstance(prompt, list):
        return 0
    total = 0
    for item in prompt:
        if isinstance(item, int):
            total += 1
        elif isinstance(item, list):
            total += len(item)
    return total


def _count_bounded(texts: list[str], counter: TokenCounter) -> int:
    """Tokens of all texts, with the tokenizer's work bounded per request however the
    prompt is split: past _COUNT_BUDGET_CHARS, the rest is scaled by the tokens per
    character measured so far (a body of 1,000 distinct 4k-character messages would
    otherwise hold the event loop for half a second)."""
    budget = _COUNT_BUDGET_CHARS
    tokens = counted = rest = 0
    for text in texts:
        if budget <= 0:
            rest += len(text)
        elif text:
            tokens += counter.count(text)
            counted += len(text)
            budget -= len(text)
    if rest:
        per_char = tokens / counted if counted else 1.0 / _CHARS_PER_TOKEN
        tokens += round(rest * per_char)
    return tokens


def _bounded(texts: list[str], budget: int) -> Iterator[str]:
    """The texts, each cut to its head and tail, until `budget` characters are given."""
    for text in texts:
        if budget <= 0:
            return
        half = min(len(text), budget) // 2
        yield text if len(text) <= 2 * half + 1 else text[:half] + "\n" + text[-half:]
        budget -= min(len(text), budget)


def _is_code_like(text: str) -> bool:
    return (
        any(m in text for m in _CODE_LITERALS)
        or any(p.search(text) for p in _CODE_PATTERNS)
        or _has_select_from(text)
    )


def _has_select_from(text: str) -> bool:
    """SELECT then FROM within 300 chars, in linear time (a lazy regex is quadratic)."""
    start = text.find("SELECT")
    while start != -1:
        end = text.find("FROM", start + 6)
        if end == -1:
            return False
        if end - start <= 300:
            return True
        start = text.find("SELECT", end - 300)
    return False


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # a JSON integer too large for a float
        return None
    return number if math.isfinite(number) else None


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value
