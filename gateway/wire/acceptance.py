"""Per-request acceptance, from what the speculative backend reported.

Two figures per answer. `rate` is vLLM's own: accepted / proposed draft
tokens, over the steps that drafted. `per_step` is what the answer gained:
accepted drafts per decode step over k, every step counted, so a step yields
1 + k * per_step tokens. They differ where the drafter proposes on some steps
only: vLLM's n-gram drafter proposes nothing where the text has no match. On
the real CPU pair a chat answer at temperature 0 drafted on 2 of 61 steps at a
rate of 0.38 (1.05 tokens a step, not the 2.5 the rate alone implies), and at
temperature 1.0 on none (2026-12-03, benchmarks/real_steps.py; docs/decision.md).
The router learns per_step; the metrics and logs keep vLLM's rate beside it.

Three sources, in this order:
1. vLLM's per-request speculative metrics (`--per-request-spec-decode-metrics`),
   which arrive as `metrics.speculative_decoding` in a non-streamed body or in
   the final usage chunk of a stream: exact, an answer that drafted nothing
   included (per_step 0).
2. Without them, the workload's rate attributed from vLLM's server-wide
   counters (classifier/attribution.py), once it is certain enough (standard
   error under 0.03): a workload's rate, not this request's own, and per_step
   taken as the rate (a full draft on every step: right for a draft model,
   high for n-gram, whose steps without a draft the counters do not count).
3. Last resort, streams with one choice: vLLM streams one chunk per engine
   step per request, so completion tokens / content chunks is the number of
   tokens each step produced. It overestimates when chunks merge (a client
   reading slower than the engine steps).
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
    rate: float  # accepted draft tokens / proposed draft tokens (0: nothing proposed)
    mean_length: float  # tokens per decode step, every step counted (1: nothing accepted)
    source: str  # PER_REQUEST_METRICS, COUNTER_ATTRIBUTION or STREAM_STEPS
    per_step: float  # accepted drafts per decode step / k: (mean_length - 1) / k


def measured_acceptance(
    report: dict[str, Any] | None,
    completion_tokens: int | None,
    token_events: int,
    one_stream: bool,
    attributed_rate: float | None,
    num_speculative_tokens: int,
) -> MeasuredAcceptance | None:
    """A speculative answer's acceptance from the best source it has (see above)."""
    if reports_spec_metrics(report):
        return from_report(report, completion_tokens)
    if completion_tokens is None or completion_tokens < 2:
        return None  # one token is the prefill's: nothing was drafted
    measured = from_counters(attributed_rate, num_speculative_tokens)
    if measured is None and one_stream:
        measured = from_stream_steps(completion_tokens, token_events, num_speculative_tokens)
    return measured


def reports_spec_metrics(report: dict[str, Any] | None) -> bool:
    """The answer carries vLLM's per-request speculative metrics (drafted or not):
    the server runs with --per-request-spec-decode-metrics."""
    metrics = report.get("metrics") if report else None
    return isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict)


def from_report(
    report: dict[str, Any] | None, completion_tokens: int | None = None
) -> MeasuredAcceptance | None:
    """vLLM's `metrics.speculative_decoding`, if the backend sent it.

    vLLM's mean_acceptance_length counts only the steps that drafted; with the
    answer's length the steps that did not count too: after the prefill's first
    token each step yields 1 + its accepted drafts, so the decode took
    (completion - 1 - accepted) steps."""
    metrics = report.get("metrics") if report else None
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(spec, dict):
        return None
    rate, length = _number(spec, "draft_acceptance_rate"), _number(spec, "mean_acceptance_length")
    k, accepted = _number(spec, "num_spec_tokens"), _number(spec, "num_accepted_draft_tokens")
    drafted_steps = _number(spec, "num_spec_steps")
    if rate is None or length is None or k is None or accepted is None or drafted_steps is None:
        return None
    if k <= 0:
        return None
    if not spec.get("num_draft_tokens"):
        rate, length = 0.0, 1.0  # nothing was drafted: every step yielded one token
    elif completion_tokens is not None and completion_tokens - 1 - accepted >= drafted_steps > 0:
        length = (completion_tokens - 1) / (completion_tokens - 1 - accepted)
    per_step = min(1.0, max(0.0, (length - 1.0) / k))
    return MeasuredAcceptance(rate, length, PER_REQUEST_METRICS, per_step)


def _number(d: dict[str, Any], key: str) -> float | None:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def from_counters(rate: float | None, num_speculative_tokens: int) -> MeasuredAcceptance | None:
    """The workload's rate attributed from vLLM's counters: accepted per verify step
    is rate x k, so a step yields 1 + rate x k tokens."""
    if rate is None:
        return None
    return MeasuredAcceptance(
        rate, 1.0 + rate * num_speculative_tokens, COUNTER_ATTRIBUTION, per_step=rate
    )


def from_stream_steps(
    completion_tokens: int | None, steps: int, num_speculative_tokens: int
) -> MeasuredAcceptance | None:
    """Tokens per streamed step -> acceptance, for one-choice streams."""
    if not completion_tokens or steps <= 0 or num_speculative_tokens <= 0:
        return None
    length = completion_tokens / steps
    rate = min(1.0, max(0.0, (length - 1.0) / num_speculative_tokens))
    return MeasuredAcceptance(rate, length, STREAM_STEPS, per_step=rate)
