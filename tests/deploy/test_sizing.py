"""deploy/gpu/sizing.py: how one GPU is split between the two vLLM servers."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from deploy.gpu import sizing
from deploy.gpu.sizing import GIB, SizingError, kv_bytes_per_token, plan_split, weights_gib
from tests.deploy.conftest import DEPLOY, ROOT, run


def test_llama_8b_with_1b_draft_on_an_h200() -> None:
    # The seed's demo pair: ~16 GB target, ~2.5 GB draft.
    plan = plan_split(140.4, 14.96, 2.30)
    s, b = plan.speculative, plan.baseline
    assert s.weights_gib == pytest.approx(17.26)
    assert b.weights_gib == pytest.approx(14.96)
    # Everything fits with the reserves left free.
    assert s.budget_gib + b.budget_gib + 2 * plan.reserve_gib <= plan.gpu_gib
    assert s.gpu_memory_utilization + b.gpu_memory_utilization <= 1 - 2 * 1.0 / 140.4
    # The baseline (which takes the overflow) gets 60% of the KV cache.
    kv_total = s.kv_cache_gib + b.kv_cache_gib
    assert s.kv_cache_gib / kv_total == pytest.approx(0.4, abs=0.01)
    assert (s.gpu_memory_utilization, b.gpu_memory_utilization) == (0.429, 0.556)


def test_budget_is_what_vllm_gets_from_the_rounded_fraction() -> None:
    plan = plan_split(79.6, 14.96, 0.0)
    for share in (plan.speculative, plan.baseline):
        assert share.budget_gib == pytest.approx(share.gpu_memory_utilization * 79.6)
        assert (
            share.gpu_memory_utilization == math.floor(share.gpu_memory_utilization * 1000) / 1000
        )
        assert share.kv_cache_memory_bytes == int(share.kv_cache_gib * GIB)


def test_ngram_has_no_draft_weights_so_both_load_the_same() -> None:
    plan = plan_split(79.6, 14.96)
    assert plan.speculative.weights_gib == plan.baseline.weights_gib


def test_kv_share_and_tokens() -> None:
    plan = plan_split(
        140.4,
        14.96,
        2.30,
        speculative_kv_share=0.5,
        target_kv_bytes_per_token=131072,
        draft_kv_bytes_per_token=32768,
    )
    s, b = plan.speculative, plan.baseline
    assert s.kv_cache_gib == pytest.approx(b.kv_cache_gib, abs=0.2)
    # The draft's KV layers share the speculative server's blocks.
    assert s.kv_tokens == s.kv_cache_memory_bytes // (131072 + 32768)
    assert b.kv_tokens == b.kv_cache_memory_bytes // 131072


def test_does_not_fit() -> None:
    with pytest.raises(SizingError, match="does not fit"):
        plan_split(22.5, 14.96)  # two 8B models on a 24 GB card


def test_min_kv_is_kept_for_the_smaller_side() -> None:
    plan = plan_split(45.0, 14.96, 2.3, speculative_kv_share=0.01, min_kv_gib=1.0)
    assert plan.speculative.kv_cache_gib >= 0.95  # 1 GiB less the rounding of the fraction


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gpu_gib": 0, "target_gib": 1},
        {"gpu_gib": 80, "target_gib": -1},
        {"gpu_gib": 80, "target_gib": 10, "draft_gib": -1},
        {"gpu_gib": 80, "target_gib": 10, "speculative_kv_share": 1.0},
    ],
)
def test_bad_inputs(kwargs: dict[str, Any]) -> None:
    with pytest.raises(SizingError):
        plan_split(**kwargs)


def _model_dir(root: Path, files: dict[str, int], config: dict[str, object] | None = None) -> Path:
    root.mkdir()
    for name, size in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as fh:
            fh.truncate(size)  # sparse: real sizes, no disk
    if config is not None:
        (root / "config.json").write_text(json.dumps(config))
    return root


def test_weights_from_a_model_folder(tmp_path: Path) -> None:
    d = _model_dir(
        tmp_path / "m",
        {
            "model-00001-of-00002.safetensors": 5 * GIB,
            "model-00002-of-00002.safetensors": 3 * GIB,
            "pytorch_model.bin": 8 * GIB,  # ignored: vLLM loads the safetensors
            "tokenizer.json": 10_000_000,
        },
    )
    assert weights_gib(d) == pytest.approx(8.0)
    only_bin = _model_dir(tmp_path / "b", {"pytorch_model.bin": 2 * GIB})
    assert weights_gib(only_bin) == pytest.approx(2.0)
    with pytest.raises(SizingError, match="no weight files"):
        weights_gib(_model_dir(tmp_path / "empty", {"README.md": 10}))


def test_kv_bytes_per_token_from_config(tmp_path: Path) -> None:
    llama_8b = {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "torch_dtype": "bfloat16",
    }
    assert kv_bytes_per_token(_model_dir(tmp_path / "a", {}, llama_8b)) == 131072
    qwen3 = {**llama_8b, "num_hidden_layers": 36, "head_dim": 128, "hidden_size": 4096}
    assert kv_bytes_per_token(_model_dir(tmp_path / "b", {}, qwen3)) == 147456
    mla = {**llama_8b, "kv_lora_rank": 512}
    assert kv_bytes_per_token(_model_dir(tmp_path / "c", {}, mla)) is None
    assert kv_bytes_per_token(tmp_path / "missing") is None


def test_every_documented_example_is_in_the_readme() -> None:
    readme = (DEPLOY / "README.md").read_text()
    table = sizing.examples_markdown()
    for line in table.splitlines():
        assert line in readme, f"deploy/README.md lacks the sizing row: {line}"
    assert "does not fit" in table  # the 24 GB example says so


def test_command_line_shell_output_is_what_launch_sh_reads(tmp_path: Path) -> None:
    target = _model_dir(tmp_path / "t", {"model.safetensors": 15 * GIB})
    draft = _model_dir(tmp_path / "d", {"model.safetensors": 2 * GIB})
    script = str(DEPLOY / "gpu" / "sizing.py")
    args = ["--gpu-mib", "143771", "--target-dir", str(target), "--draft-dir", str(draft)]
    res = run([sys.executable, script, *args, "--format", "shell"], cwd=ROOT)
    assert res.returncode == 0, res.stderr
    values = dict(line.split("=", 1) for line in res.stdout.splitlines())
    assert set(values) == {"SPEC_GPU_UTIL", "BASE_GPU_UTIL", "SPEC_KV_BYTES", "BASE_KV_BYTES"}
    expected = plan_split(143771 / 1024, 15, 2)
    assert float(values["SPEC_GPU_UTIL"]) == expected.speculative.gpu_memory_utilization
    assert float(values["BASE_GPU_UTIL"]) == expected.baseline.gpu_memory_utilization

    res = run([sys.executable, script, *args, "--format", "json"], cwd=ROOT)
    assert json.loads(res.stdout)["speculative"]["weights_gib"] == 17.0

    res = run([sys.executable, script, "--gpu-gib", "22", "--target-gib", "15"], cwd=ROOT)
    assert res.returncode == 2
    assert "does not fit" in res.stderr


def test_n_servers_share_one_gpu_by_weight() -> None:
    servers = [
        sizing.Server("none"),
        sizing.Server("eagle3-k3", True, 0.8),
        sizing.Server("eagle3-k7", True, 0.8),
        sizing.Server("ngram-k8", True),
    ]
    plan = sizing.plan_servers(140.4, 14.96, servers)
    assert [s.name for s in plan.shares] == ["none", "eagle3-k3", "eagle3-k7", "ngram-k8"]
    assert sum(s.budget_gib for s in plan.shares) + 4 * plan.reserve_gib <= plan.gpu_gib
    kv = [s.kv_cache_gib for s in plan.shares]
    # 0.6 : 0.4 : 0.4 : 0.4 of the KV memory (less each fraction's rounding down).
    assert kv[0] / kv[3] == pytest.approx(1.5, abs=0.01)
    assert kv[1] == pytest.approx(kv[2])
    assert plan.shares[1].weights_gib == pytest.approx(15.76)


def test_the_pair_is_plan_servers_of_two() -> None:
    pair = plan_split(140.4, 14.96, 2.30)
    servers = [sizing.Server("speculative", True, 2.30), sizing.Server("baseline")]
    assert (pair.speculative, pair.baseline) == sizing.plan_servers(140.4, 14.96, servers).shares


def test_one_server_alone_gets_the_gpu_less_its_reserve() -> None:
    (alone,) = sizing.plan_servers(80.0, 14.96, [sizing.Server("none")]).shares
    assert alone.gpu_memory_utilization == math.floor((80.0 - 1.0) / 80.0 * 1000) / 1000


def test_the_floor_holds_for_n_servers() -> None:
    servers = [sizing.Server("a"), *(sizing.Server(f"s{i}", True) for i in range(3))]
    plan = sizing.plan_servers(100.0, 14.96, servers, speculative_kv_share=0.01, min_kv_gib=2.0)
    assert min(s.kv_cache_gib for s in plan.shares) >= 1.9  # 2 GiB less the rounding
    assert plan.shares[0].kv_cache_gib > 15
    with pytest.raises(SizingError, match="4 servers"):
        sizing.plan_servers(60.0, 14.96, servers)


def test_every_route_example_is_in_the_readme() -> None:
    readme = (DEPLOY / "README.md").read_text()
    table = sizing.route_examples_markdown()
    for line in table.splitlines():
        assert line in readme, f"deploy/README.md lacks the sizing row: {line}"
    assert "does not fit" in table
