"""Request bodies in: the OpenAI/vLLM request format, validated as vLLM does.

Parsing validates what the emulator needs and turns it into GenerationRequest;
errors raise ApiError, which the app's middleware renders in vLLM's shape
`{"error": {"message", "type", "param", "code"}}` (code = the HTTP status, an int).
Response bodies are built in bodies.py.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from .config import EmulatorConfig
from .textgen import count_tokens

Endpoint = Literal["chat", "completion"]
_CHAT_TEMPLATE_TOKENS_PER_MESSAGE = 5  # <|im_start|>role\n ... <|im_end|>\n
_CHAT_TEMPLATE_TOKENS_PRIMER = 3  # <|im_start|>assistant\n
# What decides the answer's text; max_tokens, stop or streaming only decide where it ends
# or how it travels, so the same question gets the same (prefix of the) answer.
_CONTENT_KEYS = (
    "messages",
    "prompt",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "tools",
    "top_p",
    "top_k",
    "seed",
)


class ApiError(Exception):
    """An error answered to the client in vLLM's error shape."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's ErrorResponse; `type` names the error class, `code` is the HTTP status."""
    err_type = _ERROR_TYPES.get(
        status, "InternalServerError" if status >= 500 else "BadRequestError"
    )
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


@dataclass(frozen=True)
class GenerationRequest:
    """What the emulator needs from a chat or completion request."""

    endpoint: Endpoint
    prompt_text: str
    prompt_tokens: int
    max_tokens: int  # resolved: what the engine may generate
    max_tokens_param: int | None  # as the client sent it
    min_tokens: int
    ignore_eos: bool
    stop: list[str]
    temperature: float
    seed: int | None
    json_schema: dict[str, Any] | None  # {} = json_object
    structured: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    digest: str  # of what decides the answer's text: seeds it


def parse_generation(body: Any, endpoint: Endpoint, c: EmulatorConfig) -> GenerationRequest:
    """Validate a request body; raise ApiError as vLLM would answer it."""
    if not isinstance(body, dict):
        raise ApiError("Request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != c.model:
        raise ApiError(f"The model `{model}` does not exist.", 404, "model")
    prompt_text, prompt_tokens = (
        _chat_prompt(body) if endpoint == "chat" else _completion_prompt(body)
    )
    if prompt_tokens > c.max_model_len:
        raise ApiError(
            f"This model's maximum context length is {c.max_model_len} tokens. "
            f"However, your prompt contains {prompt_tokens} input tokens, which exceeds "
            "this limit even without any output tokens. "
            "Please reduce the length of the input prompt.",
            param="input_tokens",
        )
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_param = body.get(key, 16 if endpoint == "completion" else None)
    _check(
        max_param is None or (_is_int(max_param) and max_param >= 1),
        f"{key} must be at least 1",
        key,
    )
    if max_param is not None and max_param > c.max_model_len:
        raise ApiError(
            f"{key}={max_param} cannot be greater than max_model_len={c.max_model_len}. "
            "Please request fewer output tokens.",
            param=key,
        )
    room = c.max_model_len - prompt_tokens
    max_tokens = room if max_param is None else min(max_param, room)
    _check(_field(body, "n", 1) == 1, "the emulator serves n=1 only", "n")
    temperature = _field(body, "temperature", 1.0)
    _check(
        isinstance(temperature, int | float) and temperature >= 0,
        "temperature must be >= 0",
        "temperature",
    )
    stream = _field(body, "stream", False) is True
    options = body.get("stream_options")
    _check(
        options is None or stream,
        "Stream options can only be defined when `stream=True`.",
        "stream_options",
    )
    options = options if isinstance(options, dict) else {}
    include_usage = bool(options.get("include_usage"))
    raw_stop = body.get("stop") or []
    stop: Any = [raw_stop] if isinstance(raw_stop, str) else raw_stop
    _check(
        isinstance(stop, list) and all(isinstance(s, str) for s in stop),
        "stop must be strings",
        "stop",
    )
    min_tokens = _field(body, "min_tokens", 0)
    _check(_is_int(min_tokens) and min_tokens >= 0, "min_tokens must be >= 0", "min_tokens")
    _check(
        max_param is None or min_tokens <= max_param,
        f"min_tokens must be less than or equal to max_tokens={max_param}, got {min_tokens}.",
        "min_tokens",
    )
    schema = _json_schema(body)
    guided = (
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    )
    digest_source = {k: body.get(k) for k in _CONTENT_KEYS} | {"temperature": float(temperature)}
    return GenerationRequest(
        endpoint=endpoint,
        prompt_text=prompt_text,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        max_tokens_param=max_param,
        min_tokens=min_tokens,
        ignore_eos=_field(body, "ignore_eos", False) is True,
        stop=stop,
        temperature=float(temperature),
        seed=body.get("seed") if _is_int(body.get("seed")) else None,
        json_schema=schema,
        structured=schema is not None or any(body.get(g) is not None for g in guided),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=include_usage and bool(options.get("continuous_usage_stats")),
        digest=hashlib.sha256(json.dumps(digest_source, sort_keys=True).encode()).hexdigest(),
    )


def _chat_prompt(body: dict[str, Any]) -> tuple[str, int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list", param="messages")
    texts: list[str] = []
    tokens = _CHAT_TEMPLATE_TOKENS_PRIMER
    for message in messages:
        _check(
            isinstance(message, dict) and isinstance(message.get("role"), str),
            "each message needs a role",
            "messages",
        )
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        text = content if isinstance(content, str) else ""
        texts.append(text)
        tokens += _CHAT_TEMPLATE_TOKENS_PER_MESSAGE + count_tokens(text)
    return "\n".join(texts), tokens


def _completion_prompt(body: dict[str, Any]) -> tuple[str, int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt, max(1, count_tokens(prompt))
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return "", len(prompt)
    raise ApiError(
        "prompt must be a string, or a list of token ids (one prompt only)", param="prompt"
    )


def _json_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema", {}) if isinstance(spec, dict) else {}
        return schema if isinstance(schema, dict) else {}
    outputs = body.get("structured_outputs")
    if isinstance(outputs, dict) and isinstance(outputs.get("json"), dict):
        return dict(outputs["json"])
    guided = body.get("guided_json")
    return dict(guided) if isinstance(guided, dict) else None


def _field(body: dict[str, Any], name: str, default: Any) -> Any:
    value = body.get(name)
    return default if value is None else value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise ApiError(message, param=param)
