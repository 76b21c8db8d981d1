"""The emulator's GPU is the measured one (tooling/emulator/gpu/): every measured point
reproduced, the speculative step composed as it was timed, two servers time-sliced."""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from tooling.emulator import EmulatorConfig
from tooling.emulator.costs import (
    MeasuredGpu,
    StepShape,
    baseline_step_ms,
    draft_cost_ratio,
    dynamic_step_ms,
    speculative_step_ms,
)
from tooling.emulator.engine import SharedGpu
from tooling.emulator.gpu import build
from tooling.emulator.gpu.profile import load_gpu_profile, profile_names

MEASURED = Path(build.__file__).parent / "measured"
LLAMA = "h200-llama3.1-8b"
DRAFTER_MODELS = {"llama-3.2-1b": "draft-1b", "eagle3-head-8b": "eagle3"}


def _rows(kind: str) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(MEASURED.glob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["kind"] == kind]


def test_the_shipped_profiles_are_built_from_the_committed_measurements() -> None:
    """Provenance: rebuilding from measured/*.jsonl gives the committed files, byte for byte."""
    built = build.build()
    assert set(built) == set(profile_names()) == {LLAMA, "h200-qwen3-32b"}
    for name, profile in built.items():
        committed = (Path(build.__file__).parent / f"{name}.json").read_text(encoding="utf-8")
        assert build.render(profile) == committed, f"{name}.json: run python -m {build.__name__}"
        assert "random weights" in profile["method"] and "not vLLM" in profile["method"].replace(
            "Not vLLM", "not vLLM"
        )


def test_every_measured_step_is_reproduced_within_3_percent() -> None:
    """Each decode row (any context, with or without a prefill chunk), each drafter pass
    and each prefill of the measurement, against the emulator's cost of the same shape."""
    llama = load_gpu_profile(LLAMA)
    qwen = load_gpu_profile("h200-qwen3-32b")
    worst = (0.0, "")
    checked = 0
    for r in _rows("decode"):
        b, q, ctx, p = r["batch"], r["q"], r["ctx"], r["prefill"]
        if r["model"] == "llama-3.1-8b":
            got = MeasuredGpu(llama, None).target_ms(b, q, ctx, p)
        elif r["model"] == "qwen3-32b":
            got = MeasuredGpu(qwen, None).target_ms(b, q, ctx, p)
        else:
            got = llama.drafter(DRAFTER_MODELS[r["model"]]).pass_ms(b, q, ctx)
        err = abs(got / r["ms"] - 1)
        worst = max(worst, (err, f"{r['model']} b={b} q={q} ctx={ctx} p={p}"))
        checked += 1
    for r in _rows("prefill"):
        profile = {"llama-3.1-8b": llama, "qwen3-32b": qwen}.get(r["model"])
        if profile is None:  # the 1B's own prefill: priced as a share of the target's
            continue
        err = abs(MeasuredGpu(profile, None).target_ms(0, 1, 0, r["tokens"]) / r["ms"] - 1)
        worst = max(worst, (err, f"{r['model']} prefill {r['tokens']}"))
        checked += 1
    print(f"{checked} measured points, worst error {worst[0]:.2%} at {worst[1]}")
    assert checked == 178  # every decode row and target prefill of measured/*.jsonl
    assert worst[0] <= 0.03, worst


@pytest.mark.parametrize(
    ("drafter", "k", "expected"),
    [  # measured/tables.md, "spec step ms": the drafter's catch-up on k+1, k-1 passes, verify
        ("draft-1b", 4, {1: 13.90, 8: 15.34, 64: 25.75, 128: 40.92, 256: 72.39}),
        ("eagle3", 4, {1: 7.93, 8: 8.57, 64: 15.97, 128: 26.99, 256: 49.77}),
        # tables.md reuses EAGLE's q=5 pass for k=7's catch-up on 8 tokens; here it is
        # extended linearly in q (measured at 1 and 5 only), so it is a little dearer.
        ("eagle3", 7, {1: 9.03, 8: 9.62, 64: 21.76, 128: 38.33, 256: 73.29}),
    ],
)
def test_the_speculative_step_is_composed_as_measured(
    drafter: str, k: int, expected: dict[int, float]
) -> None:
    c = EmulatorConfig(mode="speculative", drafter=drafter, num_speculative_tokens=k)  # type: ignore[arg-type]
    for batch, ms in expected.items():
        assert speculative_step_ms(c, StepShape(batch, 0)) == pytest.approx(ms, rel=0.03)
    # A constant dynamic schedule of K = k costs exactly the static step.
    dyn = EmulatorConfig(mode="dynamic", drafter=drafter, num_speculative_tokens=k)  # type: ignore[arg-type]
    for batch in expected:
        same = StepShape(batch, 0, verified_drafts=k * batch, proposed_k=k)
        assert dynamic_step_ms(dyn, same) == pytest.approx(speculative_step_ms(c, same))


def test_ngram_verifies_without_a_drafter_pass() -> None:
    c = EmulatorConfig(mode="speculative", drafter="ngram")
    base = EmulatorConfig(mode="baseline")
    profile = load_gpu_profile(LLAMA)
    for batch in (1, 16, 64, 256):
        assert speculative_step_ms(c, StepShape(batch, 0)) == pytest.approx(
            profile.decode_ms(batch, 5)
        )
        # K = 0 with no model to keep in sync: a plain step.
        dyn = EmulatorConfig(mode="dynamic", drafter="ngram")
        assert dynamic_step_ms(dyn, StepShape(batch, 0)) == pytest.approx(
            baseline_step_ms(base, StepShape(batch, 0))
        )
    assert draft_cost_ratio(c) == 0.0
    assert draft_cost_ratio(EmulatorConfig(mode="speculative")) == pytest.approx(
        1.76 / 6.06, abs=0.002
    )


def test_steps_grow_with_batch_query_tokens_context_and_prefill() -> None:
    c = EmulatorConfig(mode="speculative")
    base = EmulatorConfig(mode="baseline")
    batches = list(range(1, 300, 7))
    for cfg, cost in ((base, baseline_step_ms), (c, speculative_step_ms)):
        steps = [cost(cfg, StepShape(b, 0)) for b in batches]
        assert steps == sorted(steps)
        for b in (1, 10, 100):
            by_ctx = [
                cost(cfg, StepShape(b, 0, context_tokens=n)) for n in (0, 512, 1024, 4096, 8192)
            ]
            assert by_ctx == sorted(by_ctx)
            by_chunk = [cost(cfg, StepShape(b, n)) for n in (0, 64, 512, 2048, 4096)]
            assert by_chunk == sorted(by_chunk)


async def _beside(gpu: SharedGpu, cost_s: float, until: float, steps: list[float]) -> None:
    """One server's steps back to back on a shared GPU; each one's modelled length."""
    clock = asyncio.get_running_loop().time()
    while clock < until:
        start = clock
        clock = await gpu.run(clock, cost_s)
        steps.append(clock - start)


@pytest.mark.serial  # wall-clock steps, each ratio within 10%
async def test_two_servers_on_one_gpu_are_time_sliced_as_measured() -> None:
    """measured/tables.md, "Two processes on one GPU": each row within 10%.

    The pair's processes ran their own step graphs; their steps alone came out 5-7% below
    the grid's (5.73 vs 6.06 ms at batch 1), so each row's slowdown is compared (its step
    beside the busy other over its step alone), and the two GPU shares' sum."""
    scale = 0.02  # seconds of wall clock per modelled second: the sharing is on the model
    spec, base = EmulatorConfig(mode="speculative"), EmulatorConfig(mode="baseline")
    for row in load_gpu_profile(LLAMA).pair:
        alone_b = baseline_step_ms(base, StepShape(int(row["base_batch"]), 0)) / 1000
        alone_s = speculative_step_ms(spec, StepShape(int(row["spec_batch"]), 0)) / 1000
        gpu = SharedGpu()
        until = asyncio.get_running_loop().time() + 0.25
        sb: list[float] = []
        ss: list[float] = []
        await asyncio.gather(
            _beside(gpu, alone_b * scale, until, sb), _beside(gpu, alone_s * scale, until, ss)
        )
        beside_b = statistics.median(sb[1:-1]) / scale
        beside_s = statistics.median(ss[1:-1]) / scale
        measured_b = row["base_beside_ms"] / row["base_alone_ms"]
        measured_s = row["spec_beside_ms"] / row["spec_alone_ms"]
        assert beside_b / alone_b == pytest.approx(measured_b, rel=0.10), row
        assert beside_s / alone_s == pytest.approx(measured_s, rel=0.10), row
        measured_share = row["base_alone_ms"] / row["base_beside_ms"] + (
            row["spec_alone_ms"] / row["spec_beside_ms"]
        )
        share = alone_b / beside_b + alone_s / beside_s
        assert share == pytest.approx(measured_share, abs=0.05)


async def test_a_server_alone_on_a_shared_gpu_has_all_of_it() -> None:
    gpu = SharedGpu()
    loop = asyncio.get_running_loop()
    start = loop.time()
    end = await gpu.run(start, 0.01)
    assert end - start == pytest.approx(0.01)
    # One step started halfway through another's: the first 5 ms alone, then halves.
    first = asyncio.ensure_future(gpu.run(end, 0.01))
    await asyncio.sleep(0)
    second = await gpu.run(end + 0.005, 0.01)
    assert await first == pytest.approx(end + 0.005 + 0.01)
    assert second == pytest.approx(end + 0.005 + 0.01 + 0.005)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"gpu_profile": "a100-nope"}, "no GPU profile 'a100-nope'"),
        (
            {"compute_ms_per_token": 0.1},
            "compute_ms_per_token price steps only with gpu_profile=roofline",
        ),
        ({"gpu_profile": "h200-qwen3-32b"}, "h200-qwen3-32b measured no drafter \\(none"),
        ({"drafter": "medusa"}, "measured no drafter 'medusa'"),
    ],
)
def test_a_gpu_or_drafter_that_was_not_measured_is_refused(
    knobs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        EmulatorConfig(mode="speculative", **knobs)


def test_the_32b_profile_runs_a_baseline_and_the_roofline_stays_an_option() -> None:
    big = EmulatorConfig(mode="baseline", gpu_profile="h200-qwen3-32b")
    assert baseline_step_ms(big, StepShape(1, 0)) == pytest.approx(20.52, rel=0.01)
    roof = EmulatorConfig(mode="speculative", gpu_profile="roofline", draft_cost_ratio=0.3)
    assert speculative_step_ms(roof, StepShape(1, 0)) == pytest.approx(2 + 2 + 6.3 + 4 * 0.3 * 8.3)
