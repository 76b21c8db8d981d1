"""benchmarks/real_routes.py's probe-bias readout: the probes' a against the answers'
mean (the source of RouterConfig.prior_sd), and the bias the router learned of them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from classifier.features import Workload
from classifier.router import RouterConfig
from classifier.speculation import alpha_from_rate
from gateway.wire.life import Lesson
from tests.classifier.test_router import IDLE, SPEC, feats, make, profile

ROOT = Path(__file__).resolve().parents[2]


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_routes", ROOT / "benchmarks/real_routes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_routes"] = module
    spec.loader.exec_module(module)
    return module


def test_the_bias_is_the_probes_a_less_the_answers_mean() -> None:
    policy = make(profile(probes={Workload.CODE: 3.0}))  # k=4: a probe rate of 0.5
    f = feats(Workload.CODE)
    for rate in (0.10, 0.20) * 10:
        policy.learn(Lesson(SPEC, f, IDLE, 0.05, 1.0, 100, 128, rate, None))
    told = _module().probe_bias(policy).splitlines()
    probe, low, high = (alpha_from_rate(r, 4) for r in (0.5, 0.10, 0.20))
    mean = (low + high) / 2
    assert f"speculative code {probe:.3f} {mean:.3f} 20" in told
    assert told[-2] == f"RMS probe - traffic over 1 keys: {probe - mean:.3f}"
    # Learned: (0.14^2 for the configured prior + miss^2 - spread / 20) over two keys.
    configured = RouterConfig().prior_sd ** 2 / RouterConfig().probe_weight
    spread = ((high - low) / 2) ** 2
    learned = ((configured + (probe - mean) ** 2 - spread / 20) / 2) ** 0.5
    assert told[-1] == f"the router's learned probe bias: {learned:.3f}"
    assert _module().probe_bias(object()) == "probe bias: not a profiled policy"
