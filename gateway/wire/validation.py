"""Parse a request body once and reject what no backend could serve.

Only the fields the gateway reads (to route or to measure) are checked here;
everything else is the backend's business and passes through untouched, so
vLLM's own validation and messages still apply to it.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

from classifier.features import Endpoint
from gateway.errors import APIError

_MAX_INT = 2**31 - 1
_FAST_PARSE_BYTES = 64 * 1024
# Choices per request, as OpenAI caps it: each is a sequence in the backend's
# batch, so one request with n=10000 would slow every other client.
MAX_N = 128


def _fast_loads(raw: bytes) -> Any:
    """orjson for big bodies (about twice as fast: a 4 MB body holds the event loop
    ~4 ms instead of 7-16). Anything it refuses goes through the standard parser,
    whose rules and messages stay the gateway's (lone surrogates, huge integers)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def parse_body(raw: bytes, endpoint: Endpoint) -> dict[str, Any]:
    """The request as a dict, or an APIError(400) that says what is wrong."""
    body = _fast_loads(raw) if len(raw) >= _FAST_PARSE_BYTES else None
    if body is None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise APIError(400, "request body is not valid UTF-8") from None
        try:
            body = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise APIError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    if endpoint is Endpoint.CHAT:
        _check_messages(body)
    elif endpoint is Endpoint.RESPONSES:
        _check_input(body)
    else:
        _check_prompt(body)
    _check_common(body)
    return body


def with_member(raw: bytes, name: str, value: Any) -> bytes:
    """`raw`, a JSON object that parse_body took, with `name` set to `value`.

    The body is not re-serialised: what a parser takes and no serialiser writes back
    would change on the way (1e309 became Infinity, which is no JSON; a nesting
    json.dumps cannot recurse into was a 500). The member goes at the end, and of
    two members with one name a JSON parser keeps the last (Python's, so vLLM's, and
    pydantic's do), so it overrides one the client sent.
    """
    try:
        member = json.dumps({name: value}, separators=(",", ":"), allow_nan=False)[1:-1]
    except (ValueError, RecursionError) as exc:  # the client's part of `value`
        raise APIError(400, f"'{name}' is not valid JSON: {exc}", param=name) from None
    body = raw.rstrip(b" \t\r\n")[:-1].rstrip(b" \t\r\n")  # less its closing brace
    comma = b"" if body.endswith(b"{") else b","
    return body + comma + member.encode() + b"}"


def _check_messages(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if messages is None:
        raise APIError(400, "'messages' is a required property", param="messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty array", param="messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise APIError(400, f"{where} must be an object", param=where)
        if not isinstance(message.get("role"), str):
            raise APIError(400, f"{where}.role must be a string", param=f"{where}.role")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise APIError(
                400, f"{where}.content must be a string or an array", param=f"{where}.content"
            )
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict):
                    raise APIError(
                        400,
                        f"{where}.content[{j}] must be an object",
                        param=f"{where}.content[{j}]",
                    )


def _check_input(body: dict[str, Any]) -> None:
    """A Responses request: what routing reads (input, instructions, the stored
    response it continues, the answer's length); the items' own fields are vLLM's."""
    items = body.get("input")
    if items is None:
        raise APIError(400, "'input' is a required property", param="input")
    if not isinstance(items, str | list):
        raise APIError(400, "'input' must be a string or an array", param="input")
    if isinstance(items, list):
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise APIError(400, f"input[{i}] must be an object", param=f"input[{i}]")
    _optional(body, "instructions", str, "a string")
    _optional(body, "previous_response_id", str, "a string")
    _optional(body, "text", dict, "an object")
    _check_int(body, "max_output_tokens")


def _check_prompt(body: dict[str, Any]) -> None:
    prompt = body.get("prompt")
    if prompt is None:
        raise APIError(400, "'prompt' is a required property", param="prompt")
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return
        if all(_is_int(p) for p in prompt):
            return
        if all(isinstance(p, list) and all(_is_int(t) for t in p) for p in prompt):
            return
    raise APIError(
        400,
        "'prompt' must be a string, an array of strings, or an array of token ids",
        param="prompt",
    )


def _check_common(body: dict[str, Any]) -> None:
    _optional(body, "model", str, "a string")
    _optional(body, "stream", bool, "a boolean")
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value is not None and not (_is_number(value) and math.isfinite(value)):
            raise APIError(400, f"'{name}' must be a number", param=name)
    temperature = body.get("temperature")
    if temperature is not None and temperature < 0:
        raise APIError(400, "'temperature' must be >= 0", param="temperature")
    for name in ("max_tokens", "max_completion_tokens", "n"):
        _check_int(body, name)
    if (n := body.get("n")) is not None and not 1 <= n <= MAX_N:
        raise APIError(400, f"'n' must be between 1 and {MAX_N} (OpenAI's limit)", param="n")
    _optional(body, "stream_options", dict, "an object")
    options = body.get("stream_options")
    if options:
        _optional(options, "include_usage", bool, "a boolean", prefix="stream_options.")
        _optional(options, "continuous_usage_stats", bool, "a boolean", prefix="stream_options.")
    _optional(body, "response_format", dict, "an object")
    response_format = body.get("response_format")
    if response_format is not None and not isinstance(response_format.get("type"), str):
        raise APIError(400, "'response_format.type' must be a string", param="response_format")
    _optional(body, "tools", list, "an array")


def _check_int(body: dict[str, Any], name: str) -> None:
    value = body.get(name)
    if value is None:
        return
    if not _is_int(value):
        raise APIError(400, f"'{name}' must be an integer", param=name)
    if not 0 <= value <= _MAX_INT:
        raise APIError(400, f"'{name}' must be between 0 and {_MAX_INT}", param=name)


def _optional(body: dict[str, Any], name: str, kind: type, what: str, *, prefix: str = "") -> None:
    value = body.get(name)
    if value is None:
        return
    if (kind is not bool and isinstance(value, bool)) or not isinstance(value, kind):
        raise APIError(400, f"'{prefix}{name}' must be {what}", param=f"{prefix}{name}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
