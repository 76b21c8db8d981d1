"""Per-request acceptance, from what the speculative backend reported.

Three sources, in this order:
1. vLLM's per-request speculative metrics (`--per-request-spec-decode-metrics`),
   which arrive as `metrics.speculative_decoding` in a non-streamed body or in
   the final usage chunk of a stream: exact.
2. Without them, the workload's rate attributed from vLLM's server-wide
   counters (classifier/attribution.py), once it is certain enough (standard
   error under 0.03): a workload's rate, not this request's own.
3. Last resort, streams only: vLLM streams one chunk per engine step per
   request, so completion tokens / content chunks is the number of tokens each
   verify step produced, and that minus one is the number of draft tokens
   accepted per step. It overestimates when chunks merge (a client reading
   slower than the engine steps); tests/vllm measures it against real vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PER_REQUEST_METRICS = "per_request_metrics"
COUNTER_ATTRIBUTION = "counter_attribution"
STREAM_STEPS = "stream_steps"
UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class MeasuredAcceptance:
    rate: float  # accepted draft tokens / proposed draft tokens
    mean_length: float  # tokens per verify step (accepted + the bonus token)
    source: str  # PER_REQUEST_METRICS, COUNTER_ATTRIBUTION or STREAM_STEPS


def reports_spec_metrics(report: dict[str, Any] | None) -> bool:
    """The answer carries vLLM's per-request speculative metrics (drafted or not):
    the server runs with --per-request-spec-decode-metrics."""
    metrics = report.get("metrics") if report else None
    return isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict)


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


def from_counters(rate: float | None, num_speculative_tokens: int) -> MeasuredAcceptance | None:
    """The workload's rate attributed from vLLM's counters: accepted per verify step
    is rate x k, so a step yields 1 + rate x k tokens."""
    if rate is None:
        return None
    return MeasuredAcceptance(rate, 1.0 + rate * num_speculative_tokens, COUNTER_ATTRIBUTION)


def from_stream_steps(
    completion_tokens: int | None, steps: int, num_speculative_tokens: int
) -> MeasuredAcceptance | None:
    """Tokens per streamed step -> acceptance, for one-choice streams."""
    if not completion_tokens or steps <= 0 or num_speculative_tokens <= 0:
        return None
    per_step = completion_tokens / steps
    rate = min(1.0, max(0.0, (per_step - 1.0) / num_speculative_tokens))
    return MeasuredAcceptance(rate, per_step, STREAM_STEPS)
