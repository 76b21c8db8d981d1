"""Per-request acceptance, from what the speculative backend reported.

First choice: vLLM's per-request speculative metrics
(`--per-request-spec-decode-metrics`), which arrive as
`metrics.speculative_decoding` in a non-streamed body or in the final usage
chunk of a stream. Fallback for servers without them: vLLM streams one chunk
per engine step per request, so completion tokens / content chunks is the
number of tokens each verify step produced, and that minus one is the number
of draft tokens accepted per step. This is the same information as
`continuous_usage_stats` gives, without rewriting every chunk; how close it
comes to the ground truth is measured against real vLLM in tests/vllm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PER_REQUEST_METRICS = "per_request_metrics"
STREAM_STEPS = "stream_steps"


@dataclass(frozen=True, slots=True)
class MeasuredAcceptance:
    rate: float  # accepted draft tokens / proposed draft tokens
    mean_length: float  # tokens per verify step (accepted + the bonus token)
    source: str  # PER_REQUEST_METRICS or STREAM_STEPS


def from_report(report: dict[str, Any] | None) -> MeasuredAcceptance | None:
    """vLLM's `metrics.speculative_decoding`, if the backend sent it."""
    metrics = report.get("metrics") if report else None
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(spec, dict):
        return None
    rate, length = spec.get("draft_acceptance_rate"), spec.get("mean_acceptance_length")
    if not isinstance(rate, int | float) or not isinstance(length, int | float):
        return None
    if not spec.get("num_draft_tokens"):
        return None  # nothing was drafted: no acceptance to speak of
    return MeasuredAcceptance(float(rate), float(length), PER_REQUEST_METRICS)


def from_stream_steps(
    completion_tokens: int | None, steps: int, num_speculative_tokens: int
) -> MeasuredAcceptance | None:
    """Tokens per streamed step -> acceptance, for one-choice streams."""
    if not completion_tokens or steps <= 0 or num_speculative_tokens <= 0:
        return None
    per_step = completion_tokens / steps
    rate = min(1.0, max(0.0, (per_step - 1.0) / num_speculative_tokens))
    return MeasuredAcceptance(rate, per_step, STREAM_STEPS)
