"""benchmarks/real_routes.py's probe-bias readout: the probes' rate against the answers'
mean (the source of RouterConfig.prior_sd), and the bias the router learned of them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from classifier.features import Workload
from classifier.router import RouterConfig
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


def test_the_bias_is_the_probes_rate_less_the_answers_mean() -> None:
    policy = make(profile(probes={Workload.CODE: 3.0}))  # k=4: a probe rate of 0.5
    f = feats(Workload.CODE)
    for rate in (0.10, 0.20) * 10:  # the answers' mean: 0.15
        policy.learn(Lesson(SPEC, f, IDLE, 0.05, 1.0, 100, 128, rate, None))
    told = _module().probe_bias(policy).splitlines()
    assert "speculative code 0.500 0.150 20" in told
    assert told[-2] == "RMS probe - traffic over 1 keys: 0.350"
    # Learned: (0.14^2 for the configured prior + 0.35^2 - 0.05^2 / 20) over two keys.
    configured = RouterConfig().prior_sd ** 2 / RouterConfig().probe_weight
    learned = ((configured + 0.35**2 - 0.05**2 / 20) / 2) ** 0.5
    assert told[-1] == f"the router's learned probe bias: {learned:.3f}"
    assert _module().probe_bias(object()) == "probe bias: not a profiled policy"
