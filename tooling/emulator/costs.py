"""How long one engine step takes, composed from what one GPU measured.

A step of a vLLM server is up to three kinds of work on its GPU:

    target(d, q, ctx, p)   the target model's forward: d decoding sequences with q query
                           tokens each (q = 1 plain decode, q = k+1 a verification of k
                           drafts) against ctx KV tokens each, plus a chunk of p prompt tokens
    draft(d, q, ctx)       one pass of the drafter over d sequences (q tokens each)
    draft_prefill(d, p)    the drafter's work on the step's prompt tokens

and a step of each server kind is composed from them as measure_steps.py timed it:

    baseline:    target(d, 1, ctx, p)
    speculative: target(d, k+1, ctx, p)                       verify k drafts per sequence
                 + draft(d, k+1, ctx) + (k-1) * draft(d, 1, ctx)   catch up on the k+1
                                                              verified tokens, draft k-1 more
                 + draft_prefill(d, p)
    dynamic:     target(d, 1 + v/d, ctx, p)                   verify the v drafts carried in
                 + draft(d, 1 + v/d, ctx) + (K-1) * draft(d, 1, ctx)   propose K for the next
                 + draft_prefill(d, p)

(dynamic: vLLM's num_speculative_tokens_per_batch_size, dynamic.py. K = 0 still costs
the catch-up pass where the drafter is a model, as vLLM's model drafters run their first
forward to keep the draft KV cache in sync, `draft_forward_at_k0`; a step that neither
verifies nor proposes without it is a plain step. With K = k on every step a decode step
costs exactly the speculative one.)

The three parts come from a GPU:
- a **measured** profile (gpu/: the default, `h200-llama3.1-8b`, an NVIDIA H200, or a
  file `specroute gpu build` wrote from the user's own GPU): every part read from its
  tables and interpolated (gpu/profile.py), the drafter chosen by its name there (the
  H200's `draft-1b`, `eagle3`, or `ngram`, which has no model pass);
- the **roofline** (`--gpu-profile roofline`, NOT measured: the emulator's first model,
  kept for scenarios that vary a GPU's shape by hand):

      target(d, q, ctx, p) = F + [S if q > 1] + max(W + m*d, t*(d*q + p))
      draft(d, q, ctx)     = c * target(d, 1, ctx, 0)
      draft_prefill(d, p)  = r * t * p
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Protocol

from .config import EmulatorConfig
from .gpu.profile import REFERENCE_CONTEXT, Drafter, GpuProfile, load_gpu_profile

ROOFLINE = "roofline"


@dataclass(frozen=True)
class StepShape:
    """What one engine step computes."""

    decode_seqs: int  # sequences generating this step (each 1 token, or 1+k if speculative)
    prefill_tokens: int  # prompt tokens prefilled this step (chunked)
    verified_drafts: int = 0  # dynamic: draft tokens the decoding sequences verify
    proposed_k: int = 0  # dynamic: drafts proposed per sequence for the next step
    context_tokens: float = REFERENCE_CONTEXT  # mean KV tokens of the decoding sequences


class Gpu(Protocol):
    """What each part of a step costs on one GPU, in ms (time_scale 1)."""

    def target_ms(self, d: int, q: float, ctx: float, p: int) -> float: ...

    def draft_ms(self, d: int, q: float, ctx: float) -> float: ...

    def draft_prefill_ms(self, d: int, p: int) -> float: ...

    @property
    def drafts_with_a_model(self) -> bool: ...


@dataclass(frozen=True)
class MeasuredGpu:
    """A measured profile and one of its drafters (gpu/profile.py)."""

    profile: GpuProfile
    drafter: Drafter | None  # None: a baseline server (no drafter)

    def target_ms(self, d: int, q: float, ctx: float, p: int) -> float:
        if d == 0:
            return self.profile.prefill_alone_ms(p)
        return self.profile.decode_ms(d, q, ctx) + self.profile.chunk_extra_ms(d, q, p)

    def draft_ms(self, d: int, q: float, ctx: float) -> float:
        return 0.0 if self.drafter is None else self.drafter.pass_ms(d, q, ctx)

    def draft_prefill_ms(self, d: int, p: int) -> float:
        if self.drafter is None or p <= 0:
            return 0.0
        target = (
            self.profile.prefill_alone_ms(p) if d == 0 else self.profile.chunk_extra_ms(d, 1, p)
        )
        return self.drafter.compute_ratio * target

    @property
    def drafts_with_a_model(self) -> bool:
        return self.drafter is not None and self.drafter.passes is not None


@dataclass(frozen=True)
class RooflineGpu:
    """The unmeasured roofline, from the config's knobs (ms)."""

    step_overhead: float  # F
    weights_read: float  # W
    kv_read_per_seq: float  # m
    compute_per_token: float  # t
    spec_overhead: float  # S
    draft_cost_ratio: float  # c
    draft_prefill_ratio: float  # r

    def target_ms(self, d: int, q: float, ctx: float, p: int) -> float:
        memory = self.weights_read + self.kv_read_per_seq * d
        compute = self.compute_per_token * (d * q + p)
        sampler = self.spec_overhead if q > 1 else 0.0
        return self.step_overhead + sampler + max(memory, compute)

    def draft_ms(self, d: int, q: float, ctx: float) -> float:
        return self.draft_cost_ratio * self.target_ms(d, 1, ctx, 0) if d else 0.0

    def draft_prefill_ms(self, d: int, p: int) -> float:
        return self.draft_prefill_ratio * self.compute_per_token * p

    @property
    def drafts_with_a_model(self) -> bool:
        return True


@cache
def gpu_of(c: EmulatorConfig) -> Gpu:
    """The GPU a config's server runs on (cached: configs are frozen)."""
    if c.gpu_profile == ROOFLINE:
        return RooflineGpu(
            c.step_overhead_ms,
            c.weights_read_ms,
            c.kv_read_ms_per_seq,
            c.compute_ms_per_token,
            c.spec_overhead_ms,
            c.draft_cost_ratio,
            c.draft_prefill_ratio,
        )
    profile = load_gpu_profile(c.gpu_profile)
    return MeasuredGpu(profile, profile.drafter(c.drafter) if c.speculative else None)


def _drafting_ms(gpu: Gpu, shape: StepShape, q_in: float, passes: int) -> float:
    """The drafter's passes: a catch-up pass over q_in tokens per sequence, then the rest."""
    d, ctx = shape.decode_seqs, shape.context_tokens
    decode = gpu.draft_ms(d, q_in, ctx) + max(passes - 1, 0) * gpu.draft_ms(d, 1, ctx)
    return decode + gpu.draft_prefill_ms(d, shape.prefill_tokens)


def baseline_step_ms(c: EmulatorConfig, shape: StepShape) -> float:
    """Cost of a step of the engine without speculation, in modelled ms."""
    gpu = gpu_of(c)
    return gpu.target_ms(shape.decode_seqs, 1, shape.context_tokens, shape.prefill_tokens)


def speculative_step_ms(c: EmulatorConfig, shape: StepShape) -> float:
    """Cost of a verify step plus the draft passes that feed the next one."""
    gpu, k = gpu_of(c), c.num_speculative_tokens
    d, ctx, p = shape.decode_seqs, shape.context_tokens, shape.prefill_tokens
    return gpu.target_ms(d, k + 1, ctx, p) + _drafting_ms(gpu, shape, k + 1, k)


def dynamic_step_ms(c: EmulatorConfig, shape: StepShape) -> float:
    """Verify the drafts carried in, then propose `proposed_k` per sequence (K = 0 included)."""
    gpu = gpu_of(c)
    d, ctx, p = shape.decode_seqs, shape.context_tokens, shape.prefill_tokens
    drafter_runs = shape.proposed_k > 0 or (c.draft_forward_at_k0 and gpu.drafts_with_a_model)
    q = 1 + shape.verified_drafts / d if d else 1
    verify = gpu.target_ms(d, q, ctx, p)
    if not drafter_runs:
        return verify
    return verify + _drafting_ms(gpu, shape, q, max(shape.proposed_k, 1))


def step_seconds(c: EmulatorConfig, shape: StepShape) -> float:
    """Wall-clock seconds of one step for this server's mode, after time_scale."""
    if c.mode == "speculative":
        return c.scaled(speculative_step_ms(c, shape))
    if c.mode == "dynamic":
        return c.scaled(dynamic_step_ms(c, shape))
    return c.scaled(baseline_step_ms(c, shape))


def draft_cost_ratio(c: EmulatorConfig) -> float:
    """One draft pass over one plain target step at batch 1: what a gateway is told as c."""
    if c.gpu_profile == ROOFLINE:
        return c.draft_cost_ratio
    profile = load_gpu_profile(c.gpu_profile)
    gpu = MeasuredGpu(profile, profile.drafter(c.drafter))
    return round(
        gpu.draft_ms(1, 1, REFERENCE_CONTEXT) / gpu.target_ms(1, 1, REFERENCE_CONTEXT, 0), 3
    )


def gpu_name(gpu_profile: str) -> str:
    """A --gpu-profile as outputs name it: the profile's own name (a file's, not its path)."""
    return gpu_profile if gpu_profile == ROOFLINE else load_gpu_profile(gpu_profile).name


def describe_gpu(c: EmulatorConfig) -> str:
    """What everything the emulator prints says about the GPU it models."""
    if c.gpu_profile == ROOFLINE:
        return "roofline GPU (NOT measured: the knobs' own F, W, m, t, S, c, r)"
    profile = load_gpu_profile(c.gpu_profile)
    drafter = f", drafter {c.drafter} k={c.num_speculative_tokens}" if c.speculative else ""
    return profile.describe() + drafter
