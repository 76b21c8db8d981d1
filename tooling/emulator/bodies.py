"""Response bodies out: vLLM 0.32's JSON, field for field.

The builders reproduce vLLM's bodies as its pydantic models serialise them
(checked by instantiating them): a non-streamed body is a full `model_dump()`,
so absent values appear as null; a streamed chunk is
`model_dump_json(exclude_unset=True)`, so a chunk carries only the fields vLLM
sets on it; the final usage chunk also drops nulls. Per-request spec-decode
metrics ride under `metrics.speculative_decoding` in the non-streamed body and
in the final usage chunk only (vllm/entrypoints/openai/chat_completion/serving.py).
"""

from __future__ import annotations

from typing import Any

from .engine import SpecRecord
from .protocol import Endpoint


def usage(prompt: int, completion: int, *, details_field: bool = False) -> dict[str, Any]:
    """vLLM's UsageInfo as it serialises (chat's continuous usage sets the details field)."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if details_field:
        out["completion_tokens_details"] = None
    return out


def spec_metrics(record: SpecRecord, level: str, *, full_dump: bool) -> dict[str, Any] | None:
    """`metrics` of a response: {"speculative_decoding": ...} as vLLM's PerRequestMetrics."""
    if level == "none":
        return None
    steps = sum(record.histogram)
    accepted = sum(j * n for j, n in enumerate(record.histogram))
    spec: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / record.num_draft_tokens
        if record.num_draft_tokens
        else 0.0,
        "acceptance_histogram": list(record.histogram),
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": record.num_draft_tokens,
        "num_spec_tokens": record.k,
    }
    detailed = level == "detailed" and steps > 0
    if detailed or full_dump:
        spec["per_step_accepted"] = list(record.per_step_accepted) if detailed else None
        spec["per_step_drafted"] = list(record.per_step_drafted) if detailed else None
    if not full_dump:
        return {"speculative_decoding": spec}
    timing = (
        "time_to_first_token_ms",
        "generation_time_ms",
        "queue_time_ms",
        "mean_itl_ms",
        "tokens_per_second",
    )
    return {**dict.fromkeys(timing), "speculative_decoding": spec}


def chat_body(
    rid: str,
    created: int,
    model: str,
    text: str,
    finish: str,
    stop_reason: str | None,
    usage_: dict[str, Any],
    metrics: dict[str, Any] | None,
) -> dict[str, Any]:
    """A non-streamed chat completion (vLLM's ChatCompletionResponse.model_dump())."""
    message = {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": None,
        "audio": None,
    }
    message |= {"function_call": None, "reasoning": None}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    choice |= {"stop_reason": stop_reason, "token_ids": None, "routed_experts": None}
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": _full_usage(usage_),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": metrics,
    }


def completion_body(
    rid: str,
    created: int,
    model: str,
    text: str,
    finish: str,
    stop_reason: str | None,
    usage_: dict[str, Any],
    metrics: dict[str, Any] | None,
) -> dict[str, Any]:
    """A non-streamed completion (vLLM's CompletionResponse.model_dump())."""
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": stop_reason,
    }
    choice |= {
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": _full_usage(usage_),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": metrics,
    }


def _full_usage(u: dict[str, Any]) -> dict[str, Any]:
    return {**u, "prompt_tokens_details": None, "completion_tokens_details": None}


def chunk(
    endpoint: Endpoint,
    rid: str,
    created: int,
    model: str,
    *,
    text: str,
    role: bool = False,
    finish: str | None = None,
    stop_reason: str | None = None,
    usage_: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed chunk, with exactly the fields vLLM sets on it."""
    choice: dict[str, Any]
    if endpoint == "completion":
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": stop_reason,
        }
        choice |= {"prompt_token_ids": None, "token_ids": None}
        out = {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
        }
    else:
        delta = {"role": "assistant", "content": ""} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = stop_reason
        if not role:
            choice["token_ids"] = None
        out = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }
        if role:
            out |= {"prompt_token_ids": None, "prompt_text": None}
    if usage_ is not None:
        out["usage"] = usage_
    return out


def usage_chunk(
    endpoint: Endpoint,
    rid: str,
    created: int,
    model: str,
    usage_: dict[str, Any],
    metrics: dict[str, Any] | None,
) -> dict[str, Any]:
    """The final usage-only chunk (choices empty; nulls dropped; spec metrics here)."""
    obj = "text_completion" if endpoint == "completion" else "chat.completion.chunk"
    out = {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }
    if metrics is not None:
        out["metrics"] = metrics
    return out
