"""vLLM's Prometheus metrics, under vLLM's names, on the emulator's own registry.

Names, types, label names, label values and buckets follow vLLM 0.32
(vllm/v1/metrics/loggers.py, vllm/v1/metrics/buckets.py and
vllm/v1/spec_decode/metrics.py): prometheus_client appends `_total` to counter
names, so `Counter("vllm:prompt_tokens")` is exposed as `vllm:prompt_tokens_total`
exactly as vLLM's is, `_created` samples included. Every series carries
`model_name` and `engine="0"`. The spec-decode counters exist only in speculative
and dynamic mode, as in vLLM, where they exist only with a --speculative-config;
in dynamic mode a step that verifies no drafts (K = 0 before it) moves none of
them, and num_draft_tokens counts the K actually drafted, as vLLM's scheduler does.

Semantics kept from vLLM: prompt tokens are counted when a request's first token
comes out; inter-token latency is observed once per engine step that produced
tokens for a request (so a speculative step with 3 tokens is one observation);
request_success is pre-created for every finish reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .config import EmulatorConfig

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

# vllm/v1/metrics/buckets.py
_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
_LATENCY += [120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0]
_TTFT += [7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5]
_ITL += [10.0, 20.0, 40.0, 80.0]
_ITERATION = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def _one_two_five(max_value: int) -> list[float]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(float(m * scale))
        scale *= 10


@dataclass(frozen=True)
class FinishedRequest:
    """Figures of one request at its end, as vLLM's FinishedRequestStats."""

    finish_reason: str
    e2e_s: float
    queued_s: float
    prefill_s: float
    decode_s: float
    inference_s: float
    prompt_tokens: int
    generation_tokens: int
    max_tokens_param: int | None


class VllmMetrics:
    """The emulated engine's metrics; one instance (one registry) per app."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        values = (config.model, "0")
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, labels, registry=r, buckets=buckets).labels(*values)

        tokens = _one_two_five(config.max_model_len)
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=r,
        )
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            _ITERATION,
        )
        self.max_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.params_n = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", (1, 2, 5, 10, 20)
        )
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _TTFT,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            _ITL,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _LATENCY,
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _LATENCY,
        )
        self.inference = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            _LATENCY,
        )
        self.prefill = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            _LATENCY,
        )
        self.decode = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            _LATENCY,
        )
        self.spec: SpecDecodeCounters | None = None
        if config.speculative:
            self.spec = SpecDecodeCounters(r, labels, values, config.num_speculative_tokens)

    def finished(self, f: FinishedRequest) -> None:
        """Record a request that ended (vLLM's update_from_finished_request)."""
        self.success[f.finish_reason].inc()
        self.e2e.observe(f.e2e_s)
        if f.finish_reason == "abort":
            return  # timings of an aborted request are partial; vLLM's are meaningless too
        self.queue.observe(f.queued_s)
        self.prefill.observe(f.prefill_s)
        self.decode.observe(f.decode_s)
        self.inference.observe(f.inference_s)
        self.request_prompt_tokens.observe(f.prompt_tokens)
        self.request_generation_tokens.observe(f.generation_tokens)
        self.params_n.observe(1)
        if f.max_tokens_param is not None:
            self.max_generation_tokens.observe(f.max_tokens_param)
            self.params_max_tokens.observe(f.max_tokens_param)
        if f.generation_tokens > 1:
            self.tpot.observe(f.decode_s / (f.generation_tokens - 1))


class SpecDecodeCounters:
    """vllm:spec_decode_* counters (vllm/v1/spec_decode/metrics.py SpecDecodingProm)."""

    def __init__(
        self, r: CollectorRegistry, labels: list[str], values: tuple[str, str], k: int
    ) -> None:
        self.drafts = Counter(
            "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", labels, registry=r
        ).labels(*values)
        self.draft_tokens = Counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", labels, registry=r
        ).labels(*values)
        self.accepted_tokens = Counter(
            "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", labels, registry=r
        ).labels(*values)
        per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [*labels, "position"],
            registry=r,
        )
        self.per_pos = [per_pos.labels(*values, str(pos)) for pos in range(k)]

    def observe(
        self, drafts: int, draft_tokens: int, accepted: int, per_pos: Sequence[int]
    ) -> None:
        self.drafts.inc(drafts)
        self.draft_tokens.inc(draft_tokens)
        self.accepted_tokens.inc(accepted)
        for counter, n in zip(self.per_pos, per_pos, strict=True):
            counter.inc(n)
