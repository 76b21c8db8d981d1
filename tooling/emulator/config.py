"""EmulatorConfig: every knob of the emulated vLLM server, and its CLI flags.

One frozen dataclass holds the whole configuration so that the CLI
(`specroute emulate`), the demo and the tests build servers the same way. The
CLI flags are derived from the dataclass fields (one flag per field, the help
text taken from the field's metadata) so a knob cannot exist in one place and
not the other. Defaults are the calibrated ones described in CALIBRATION.md.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin, get_type_hints

from .dynamic import (
    DEFAULT_SCHEDULE,
    Schedule,
    dense_lookup,
    parse_schedule,
    schedule_arg,
    to_json,
)
from .gpu.profile import GpuProfile, load_gpu_profile, profile_names

Mode = Literal["speculative", "baseline", "dynamic"]
SPECULATIVE_MODES = ("speculative", "dynamic")
SpecMetricsLevel = Literal["none", "summary", "detailed"]
DEFAULT_GPU_PROFILE = "h200-llama3.1-8b"  # the talk's setup, measured (gpu/measured/)
ROOFLINE = "roofline"
# The roofline's knobs (costs.py): they price steps only with --gpu-profile roofline.
ROOFLINE_KNOBS = (
    "step_overhead_ms",
    "weights_read_ms",
    "kv_read_ms_per_seq",
    "compute_ms_per_token",
    "draft_cost_ratio",
    "draft_prefill_ratio",
    "spec_overhead_ms",
)
ACCEPTANCE_KNOBS = (
    "acceptance_structured",
    "acceptance_code",
    "acceptance_chat",
    "acceptance_creative",
)


def _knob(default: Any, help_text: str) -> Any:
    """A dataclass field whose help text becomes the CLI flag's help."""
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class EmulatorConfig:
    """Configuration of one emulated vLLM server (speculative, dynamic or baseline)."""

    mode: Mode
    model: str = _knob("smollm2-135m", "served model name, as vLLM's --served-model-name")
    seed: int = _knob(0, "seed for generated text and draft acceptance")
    time_scale: float = _knob(1.0, "multiply every modelled cost (0.25 = 4x faster)")
    # Engine limits (vLLM's --max-model-len, --max-num-seqs, --max-num-batched-tokens).
    max_model_len: int = _knob(8192, "prompt + output tokens limit per request")
    max_num_seqs: int = _knob(256, "most requests running in one batch")
    max_num_batched_tokens: int = _knob(2048, "token budget per engine step (chunked prefill)")
    kv_cache_tokens: int = _knob(262144, "KV cache capacity in tokens")
    kv_block_size: int = _knob(16, "KV cache block size in tokens")
    # The GPU: a measured profile (gpu/) and the drafter (costs.py).
    gpu_profile: str = _knob(
        DEFAULT_GPU_PROFILE,
        f"the measured GPU and target model whose step costs this server runs on: "
        f"{', '.join(profile_names())}, a profile file PATH.json (`specroute gpu build`, "
        f"docs/own-gpu.md), or {ROOFLINE} (NOT measured: the knobs below)",
    )
    drafter: str = _knob(
        "",
        "speculative and dynamic modes: a drafter the GPU profile measured (default: its "
        f"first; {DEFAULT_GPU_PROFILE}: draft-1b, a separate 1B draft model, eagle3, an "
        "EAGLE-3-like head, or ngram, prompt lookup with no model pass); sets the drafter's "
        "cost and, by its vLLM method, the default acceptance per workload (acceptance.py)",
    )
    # Roofline step-cost model (ms at time_scale 1), --gpu-profile roofline only; costs.py.
    step_overhead_ms: float = _knob(2.0, "fixed cost of every step: launch, sampling, scheduling")
    weights_read_ms: float = _knob(6.0, "memory time to stream the weights once per step")
    kv_read_ms_per_seq: float = _knob(0.3, "memory time per running sequence (its KV cache)")
    compute_ms_per_token: float = _knob(0.25, "compute time per token processed in a step")
    # Speculative decoding.
    num_speculative_tokens: int = _knob(4, "k: draft tokens per step (mode dynamic: the most)")
    draft_cost_ratio: float = _knob(0.2, "c: one draft pass / one baseline decode step")
    draft_prefill_ratio: float = _knob(0.05, "draft prefill compute / target prefill compute")
    spec_overhead_ms: float = _knob(2.0, "extra fixed cost of a verify step (rejection sampler)")
    # Dynamic speculative decoding (mode dynamic): vLLM's SpeculativeConfig field.
    num_speculative_tokens_per_batch_size: Schedule | None = field(
        default=None,
        metadata={
            "help": "mode dynamic: K per batch size, as in vLLM's --speculative-config, JSON "
            "[[range_start, range_end, K], ...] (inclusive; K clamped to "
            f"--num-speculative-tokens); default {to_json(DEFAULT_SCHEDULE)}"
        },
    )
    draft_forward_at_k0: bool = _knob(
        True,
        "mode dynamic: a K=0 step still runs the draft model's first forward pass, as vLLM's "
        "model drafters do to keep their KV cache in sync (off: a K=0 step is a plain step, "
        "as with an ngram drafter)",
    )
    per_request_spec_decode_metrics: SpecMetricsLevel = field(
        default="none",
        metadata={"help": "as vLLM's --per-request-spec-decode-metrics (speculative mode only)"},
    )
    # Per-request acceptance probability of each draft position (acceptance.py); unset,
    # the drafter's default (acceptance.DRAFTER_ACCEPTANCE, sources in CALIBRATION.md).
    acceptance_structured: float | None = _knob(None, "json_object / json_schema output")
    acceptance_code: float | None = _knob(None, "code- or SQL-looking prompts")
    acceptance_chat: float | None = _knob(None, "ordinary chat")
    acceptance_creative: float | None = _knob(None, "creative prompts, and temperature >= 1")
    acceptance_jitter: float = _knob(0.05, "per-request uniform +- spread of acceptance")
    # Length of plain-text answers that stop by themselves (EOS).
    text_min_tokens: int = _knob(48, "shortest natural plain-text answer")
    text_max_tokens: int = _knob(320, "longest natural plain-text answer")
    count_client_aborts: bool = _knob(
        True, "count client disconnects in vllm:request_success_total{finished_reason=abort}"
    )
    # Fault knobs at start-up (runtime: POST /emulator/faults); see faults.py.
    fail_status: int = _knob(0, "answer generation requests with this HTTP status (0 = off)")
    drop_after_chunks: int = _knob(-1, "drop the connection after N chunks (-1 = off)")
    error_after_chunks: int = _knob(
        -1, "end a stream with vLLM's in-stream 500 error event after N chunks (-1 = off)"
    )
    stall_s: float = _knob(0.0, "stall generation requests for this many seconds")
    stall_after_chunks: int = _knob(0, "stall after N chunks (0 = before the response)")
    refuse_connections: bool = _knob(False, "reset every connection before answering")
    fault_limit: int = _knob(0, "apply status/drop/stall faults to N requests only (0 = all)")

    def __post_init__(self) -> None:
        if not self.drafter:  # stored resolved: every reader sees the drafter it runs
            object.__setattr__(self, "drafter", _default_drafter(self.gpu_profile))
        problems = list(_problems(self))
        schedule = self.num_speculative_tokens_per_batch_size
        if schedule is not None and self.mode != "dynamic":
            problems.append("num_speculative_tokens_per_batch_size requires mode=dynamic")
        elif self.mode == "dynamic":
            try:  # stored sorted and validated, as vLLM's scheduler reads it
                normalised = parse_schedule(DEFAULT_SCHEDULE if schedule is None else schedule)
            except ValueError as exc:
                problems.append(str(exc))
            else:
                object.__setattr__(self, "num_speculative_tokens_per_batch_size", normalised)
        if problems:
            raise ValueError("invalid emulator config: " + "; ".join(problems))

    @property
    def speculative(self) -> bool:
        """Whether this server drafts at all (a --speculative-config in vLLM)."""
        return self.mode in SPECULATIVE_MODES

    def k_by_batch_size(self) -> list[int]:
        """Drafts proposed per request at each batch size (index 0 unused); 0s for baseline."""
        size, k = self.max_num_seqs, self.num_speculative_tokens
        if self.mode == "baseline":
            return [0] * (size + 1)
        if self.mode == "speculative":
            return [k] * (size + 1)
        return dense_lookup(self.num_speculative_tokens_per_batch_size or (), size, k)

    def scaled(self, ms: float) -> float:
        """Milliseconds of modelled cost -> seconds of wall clock at time_scale."""
        return ms * self.time_scale / 1000.0


def _problems(c: EmulatorConfig) -> list[str]:
    out: list[str] = []
    if c.mode not in get_args(Mode):
        out.append(f"mode must be one of {get_args(Mode)}, got {c.mode!r}")
    if c.per_request_spec_decode_metrics not in get_args(SpecMetricsLevel):
        out.append("per_request_spec_decode_metrics must be none, summary or detailed")
    elif c.per_request_spec_decode_metrics != "none" and c.mode not in SPECULATIVE_MODES:
        # vLLM 0.32 refuses this combination at start-up (config/vllm.py).
        out.append("per_request_spec_decode_metrics requires mode=speculative or dynamic")
    if not c.model:
        out.append("model must not be empty")
    if c.time_scale <= 0:
        out.append("time_scale must be > 0")
    positive = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_block_size")
    out += [f"{name} must be > 0" for name in positive if getattr(c, name) <= 0]
    out += [f"{name} must be >= 0" for name in (*ROOFLINE_KNOBS, "stall_s") if getattr(c, name) < 0]
    out += _gpu_problems(c)
    if c.num_speculative_tokens < 1:
        out.append("num_speculative_tokens must be >= 1")
    if c.kv_cache_tokens < c.max_model_len + c.num_speculative_tokens + c.kv_block_size:
        out.append("kv_cache_tokens must hold one max_model_len request")
    if c.max_num_batched_tokens <= c.num_speculative_tokens:
        out.append("max_num_batched_tokens must fit one speculative step (k + 1 tokens)")
    out += [
        f"{name} must be in [0, 1]"
        for name in ACCEPTANCE_KNOBS
        if getattr(c, name) is not None and not 0 <= getattr(c, name) <= 1
    ]
    if not 0 <= c.acceptance_jitter <= 0.5:
        out.append("acceptance_jitter must be in [0, 0.5]")
    if not 1 <= c.text_min_tokens <= c.text_max_tokens:
        out.append("need 1 <= text_min_tokens <= text_max_tokens")
    if c.fail_status and not 400 <= c.fail_status <= 599:
        out.append("fail_status must be 0 or an HTTP error status (400-599)")
    if c.drop_after_chunks < -1 or c.stall_after_chunks < 0 or c.fault_limit < 0:
        out.append("drop_after_chunks >= -1, stall_after_chunks >= 0, fault_limit >= 0")
    if c.error_after_chunks < -1:
        out.append("error_after_chunks >= -1")
    return out


def _measured(gpu_profile: str) -> GpuProfile:
    """The profile whose drafters a config may name (the roofline: the default's)."""
    return load_gpu_profile(DEFAULT_GPU_PROFILE if gpu_profile == ROOFLINE else gpu_profile)


def _default_drafter(gpu_profile: str) -> str:
    try:
        return _measured(gpu_profile).default_drafter
    except ValueError:  # reported by _gpu_problems
        return ""


def drafter_names(gpu_profile: str) -> tuple[str, ...]:
    """The drafters a config on this GPU may name, in the profile's order."""
    return tuple(_measured(gpu_profile).drafters)


def drafter_method(c: EmulatorConfig) -> str:
    """vLLM's speculative method of c's drafter (draft_model, eagle3, ngram, ...), as its
    profile measured it: what a gateway's [routes] says, what sets default acceptance.
    "" for a baseline server whose drafter the profile did not measure (it drafts nothing)."""
    drafter = _measured(c.gpu_profile).drafters.get(c.drafter)
    return "" if drafter is None else drafter.method


def _gpu_problems(c: EmulatorConfig) -> list[str]:
    """A GPU profile that exists, a drafter it measured, no roofline knob it would ignore."""
    try:
        profile = _measured(c.gpu_profile)
    except ValueError as exc:
        return [str(exc)]
    out = []
    if c.mode in SPECULATIVE_MODES and c.drafter not in profile.drafters:
        have = ", ".join(profile.drafters) or "none: target only, so mode baseline only"
        name = f" {c.drafter!r}" if c.drafter else ""
        out.append(f"gpu_profile {c.gpu_profile} measured no drafter{name} ({have})")
    if c.gpu_profile == ROOFLINE:
        return out
    defaults = {f.name: f.default for f in dataclasses.fields(EmulatorConfig)}
    ignored = [name for name in ROOFLINE_KNOBS if getattr(c, name) != defaults[name]]
    if ignored:
        out.append(
            f"{', '.join(ignored)} price steps only with gpu_profile={ROOFLINE}; "
            f"{c.gpu_profile} is measured"
        )
    return out


# ---- argparse glue: one flag per field -------------------------------------------------

_CLI_ONLY = ("host", "port")


def add_emulator_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --mode, --host, --port and one --flag per EmulatorConfig field."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    hints = get_type_hints(EmulatorConfig)
    for f in dataclasses.fields(EmulatorConfig):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        if f.name == "mode":
            parser.add_argument(
                flag,
                required=True,
                choices=get_args(Mode),
                help="engine kind (dynamic: K chosen per step from the batch size, as vLLM's "
                "num_speculative_tokens_per_batch_size)",
            )
        elif f.name == "num_speculative_tokens_per_batch_size":
            parser.add_argument(
                flag, type=schedule_arg, default=None, metavar="JSON", help=f.metadata["help"]
            )
        elif hint is bool:
            parser.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=f.default,
                help=f.metadata["help"],
            )
        elif hint == float | None:
            parser.add_argument(flag, type=float, default=None, help=f.metadata["help"])
        elif _is_literal(hint):
            parser.add_argument(
                flag, choices=get_args(hint), default=f.default, help=f.metadata["help"]
            )
        else:
            shown = " (default: %(default)s)" if f.default != "" else ""  # "": help says
            parser.add_argument(
                flag, type=hint, default=f.default, help=f"{f.metadata['help']}{shown}"
            )


def add_gpu_arguments(parser: argparse.ArgumentParser) -> None:
    """--gpu-profile and --drafter, for commands that start emulated servers (demo, bench,
    serve --emulate); checked when the servers' configs are built."""
    for f in dataclasses.fields(EmulatorConfig):
        if f.name in ("gpu_profile", "drafter"):
            parser.add_argument(
                "--" + f.name.replace("_", "-"),
                default=f.default,
                metavar="PROFILE" if f.name == "gpu_profile" else "NAME",
                help=f"EMULATED servers: {f.metadata['help']}"
                + (" (default: %(default)s)" if f.default else ""),
            )


def config_from_args(ns: argparse.Namespace) -> EmulatorConfig:
    """Build the config from parsed flags; host and port stay with the caller."""
    names = {f.name for f in dataclasses.fields(EmulatorConfig)}
    values = {k: v for k, v in vars(ns).items() if k in names and k not in _CLI_ONLY}
    return EmulatorConfig(**values)


def _is_literal(hint: Any) -> bool:
    return get_origin(hint) is Literal
