"""How long one engine step takes: a roofline model of a GPU forward pass.

A decode step of a transformer is bounded by two resources at once: memory
bandwidth (stream every weight once, plus each running sequence's KV cache)
and compute (every token in the step goes through every layer). The step takes
whichever is longer, plus a fixed overhead:

    target(d, p) = F + max(W + m*d, t*(d + p))           d decode tokens' seqs,
                                                         p prefill tokens
At small batches decode is memory-bound: the weights dominate and one more
sequence costs only m. That is why speculative decoding pays off there:
verifying k+1 tokens per sequence instead of one is almost free while memory
is the bottleneck. At large batches the step turns compute-bound and the k+1
tokens per sequence cost k+1 times the compute, so speculation stops paying.

A speculative step verifies k drafts per sequence and runs the draft k times:

    spec(d, p) = F + S + max(W + m*d, t*(d*(k+1) + p))   verify, S = sampler etc.
               + k * c * baseline_decode(d)              k draft passes
               + r * t * p                                draft model prefill

A dynamic step (vLLM's num_speculative_tokens_per_batch_size, dynamic.py)
verifies the v drafts its sequences carry from the previous step and proposes
K (looked up from this step's batch size) for the next one:

    dyn(d, p) = F + [S if v] + max(W + m*d, t*(d + v + p))
              + max(K, 1) * c * baseline_decode(d) + r * t * p

K = 0 still costs one draft pass and the draft prefill: vLLM's model drafters
run their first forward at K = 0 to keep the draft KV cache in sync
(v1/spec_decode/llm_base_proposer.py, "No draft tokens requested"). With
`draft_forward_at_k0` off (a drafter with no model, as ngram), a step that
neither verifies nor proposes is a plain baseline step. With a constant
schedule K = k, a decode step costs exactly the speculative one.

Defaults (ms): F=2, W=6, m=0.3, t=0.25, S=2, k=4, c=0.2, r=0.05, so a
baseline decode step is 8.3 ms at batch 1 and 27.2 ms at batch 64, and a
speculative step is 16.9 ms at batch 1 and 106 ms at batch 64. CALIBRATION.md
derives the speedups these give.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import EmulatorConfig


@dataclass(frozen=True)
class StepShape:
    """What one engine step computes."""

    decode_seqs: int  # sequences generating this step (each 1 token, or 1+k if speculative)
    prefill_tokens: int  # prompt tokens prefilled this step (chunked)
    verified_drafts: int = 0  # dynamic: draft tokens the decoding sequences verify
    proposed_k: int = 0  # dynamic: drafts proposed per sequence for the next step


def baseline_step_ms(c: EmulatorConfig, shape: StepShape) -> float:
    """Cost of a step of the engine without speculation, in modelled ms."""
    memory = c.weights_read_ms + c.kv_read_ms_per_seq * shape.decode_seqs
    compute = c.compute_ms_per_token * (shape.decode_seqs + shape.prefill_tokens)
    return c.step_overhead_ms + max(memory, compute)


def speculative_step_ms(c: EmulatorConfig, shape: StepShape) -> float:
    """Cost of a verify step plus the draft passes that feed the next one."""
    k = c.num_speculative_tokens
    memory = c.weights_read_ms + c.kv_read_ms_per_seq * shape.decode_seqs
    verified_tokens = shape.decode_seqs * (k + 1) + shape.prefill_tokens
    verify = (
        c.step_overhead_ms
        + c.spec_overhead_ms
        + max(memory, c.compute_ms_per_token * verified_tokens)
    )
    draft = 0.0
    if shape.decode_seqs:
        draft = k * c.draft_cost_ratio * baseline_step_ms(c, StepShape(shape.decode_seqs, 0))
    draft_prefill = c.draft_prefill_ratio * c.compute_ms_per_token * shape.prefill_tokens
    return verify + draft + draft_prefill


def dynamic_step_ms(c: EmulatorConfig, shape: StepShape) -> float:
    """Verify the drafts carried in, then propose `proposed_k` per sequence (K = 0 included)."""
    drafter_runs = shape.proposed_k > 0 or c.draft_forward_at_k0
    if not shape.verified_drafts and not drafter_runs:
        return baseline_step_ms(c, shape)
    memory = c.weights_read_ms + c.kv_read_ms_per_seq * shape.decode_seqs
    tokens = shape.decode_seqs + shape.verified_drafts + shape.prefill_tokens
    verify = c.step_overhead_ms + max(memory, c.compute_ms_per_token * tokens)
    if shape.verified_drafts:
        verify += c.spec_overhead_ms
    if not drafter_runs:
        return verify
    draft = 0.0
    if shape.decode_seqs:
        passes = max(shape.proposed_k, 1)
        draft = passes * c.draft_cost_ratio * baseline_step_ms(c, StepShape(shape.decode_seqs, 0))
    draft_prefill = c.draft_prefill_ratio * c.compute_ms_per_token * shape.prefill_tokens
    return verify + draft + draft_prefill


def step_seconds(c: EmulatorConfig, shape: StepShape) -> float:
    """Wall-clock seconds of one step for this server's mode, after time_scale."""
    if c.mode == "speculative":
        return c.scaled(speculative_step_ms(c, shape))
    if c.mode == "dynamic":
        return c.scaled(dynamic_step_ms(c, shape))
    return c.scaled(baseline_step_ms(c, shape))
