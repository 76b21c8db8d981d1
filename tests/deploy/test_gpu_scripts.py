"""deploy/gpu/launch.sh, down.sh and validate.sh, run for real with a stand-in
`vllm` (tests/deploy/fake_vllm.py: the emulated vLLM server behind vLLM's
command line) and, for validate.sh, a stand-in `specroute bench`. What is
checked: the staggered start, the flags each server gets (same served name,
the memory split from sizing.py, --speculative-config and per-request spec
metrics on the speculative one only), clean shutdown, failure handling, and
the output folder of the GPU check. shellcheck runs on every script."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import cast

import pytest

from deploy.gpu.sizing import GIB, Server, plan_servers, plan_split
from tests.deploy.conftest import DEPLOY, ROOT, run
from tests.support import require_tool

GPU = DEPLOY / "gpu"
HERE = Path(__file__).resolve().parent
SCRIPTS = sorted(GPU.glob("*.sh"))
H200_MIB = "143771"


def test_shellcheck() -> None:
    shellcheck = require_tool("shellcheck", "scripts/test.sh apt-installs shellcheck")
    res = run([shellcheck, "-x", "--source-path=SCRIPTDIR", "--severity=style", *map(str, SCRIPTS)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert {p.name for p in SCRIPTS} >= {"launch.sh", "down.sh", "validate.sh"}


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _model(root: Path, weights: int, layers: int) -> Path:
    root.mkdir()
    with (root / "model.safetensors").open("wb") as fh:
        fh.truncate(weights)  # sparse
    config = {
        "num_hidden_layers": layers,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
    }
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture
def models(tmp_path: Path) -> tuple[Path, Path]:
    return (
        _model(tmp_path / "Target-8B", 15 * GIB, 32),
        _model(tmp_path / "Draft-1B", 2 * GIB, 16),
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    records = tmp_path / "records"
    records.mkdir()
    return {
        **os.environ,
        "VLLM": f"{sys.executable} {HERE / 'fake_vllm.py'}",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "FAKE_VLLM_RECORD_DIR": str(records),
        "FAKE_VLLM_STARTUP_S": "0.5",
    }


def _records(env: dict[str, str], port: int) -> dict[str, object]:
    return json.loads((Path(env["FAKE_VLLM_RECORD_DIR"]) / f"{port}.json").read_text())  # type: ignore[no-any-return]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_launch_starts_the_pair_staggered_then_down_stops_it(
    tmp_path: Path, models: tuple[Path, Path], env: dict[str, str]
) -> None:
    target, draft = models
    spec_port, base_port = _free_ports(2)
    run_dir = tmp_path / "run"
    res = run(
        [
            "bash",
            str(GPU / "launch.sh"),
            "--model",
            str(target),
            "--draft",
            str(draft),
            "--served-model-name",
            "llama",
            "--spec-port",
            str(spec_port),
            "--base-port",
            str(base_port),
            "--gpu-mib",
            H200_MIB,
            "--run-dir",
            str(run_dir),
            "--timeout",
            "30",
            "--",
            "--max-num-seqs",
            "64",
        ],
        timeout=60,
        env=env,
    )
    try:
        assert res.returncode == 0, res.stderr
        assert res.stdout.splitlines() == [
            f"speculative=http://127.0.0.1:{spec_port}",
            f"baseline=http://127.0.0.1:{base_port}",
        ]
        assert (run_dir / "backends").read_text() == res.stdout
        assert "--gpu-memory-utilization" in res.stderr  # the sizing table is logged

        spec, base = _records(env, spec_port), _records(env, base_port)
        spec_argv, base_argv = spec["argv"], base["argv"]
        assert isinstance(spec_argv, list) and isinstance(base_argv, list)
        # Staggered: the baseline started after the speculative server was ready.
        assert base["started"] >= spec["ready"]  # type: ignore[operator]
        # Same model, same served name on both.
        assert spec_argv[:2] == base_argv[:2] == ["serve", str(target)]
        assert _flag(spec_argv, "--served-model-name") == _flag(base_argv, "--served-model-name")
        assert _flag(base_argv, "--served-model-name") == "llama"
        # The memory split is sizing.py's for these weights on this GPU.
        plan = plan_split(int(H200_MIB) / 1024, 15, 2)
        assert float(_flag(spec_argv, "--gpu-memory-utilization")) == (
            plan.speculative.gpu_memory_utilization
        )
        assert float(_flag(base_argv, "--gpu-memory-utilization")) == (
            plan.baseline.gpu_memory_utilization
        )
        # Speculation and its per-request metrics on the speculative server only.
        spec_config = json.loads(_flag(spec_argv, "--speculative-config"))
        assert spec_config == {
            "method": "draft_model",
            "model": str(draft),
            "num_speculative_tokens": 4,
        }
        assert _flag(spec_argv, "--per-request-spec-decode-metrics") == "detailed"
        assert "--speculative-config" not in base_argv
        assert "--per-request-spec-decode-metrics" not in base_argv
        # Extra vLLM args reach both; offline and graph memory inside the budget.
        assert _flag(spec_argv, "--max-num-seqs") == _flag(base_argv, "--max-num-seqs") == "64"
        for rec in (spec, base):
            assert rec["env"]["HF_HUB_OFFLINE"] == "1"  # type: ignore[index]
            assert rec["env"]["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"] == "1"  # type: ignore[index]
        assert _port_open(spec_port) and _port_open(base_port)
    finally:
        down = run(["bash", str(GPU / "down.sh"), "--run-dir", str(run_dir)], timeout=60)
    assert down.returncode == 0, down.stderr
    assert not _port_open(spec_port) and not _port_open(base_port)
    assert not list(run_dir.glob("*.pid"))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("ngram", {"method": "ngram", "num_speculative_tokens": 4}),
        ("eagle3", {"method": "eagle3", "num_speculative_tokens": 3}),
        ("mtp", {"method": "mtp", "num_speculative_tokens": 1}),
    ],
)
def test_launch_speculation_methods_and_a_failed_start(
    tmp_path: Path,
    models: tuple[Path, Path],
    env: dict[str, str],
    spec: str,
    expected: dict[str, object],
) -> None:
    """The server fails at once (FAKE_VLLM_FAIL): launch.sh says why, stops, exits non-zero."""
    target, draft = models
    spec_port, base_port = _free_ports(2)
    args = ["--model", str(target), "--spec", spec, "--gpu-mib", H200_MIB]
    if spec == "eagle3":
        args += ["--draft", str(draft)]
    res = run(
        [
            "bash",
            str(GPU / "launch.sh"),
            *args,
            "--spec-port",
            str(spec_port),
            "--base-port",
            str(base_port),
            "--run-dir",
            str(tmp_path / "run"),
        ],
        timeout=60,
        env={**env, "FAKE_VLLM_FAIL": "1"},
    )
    assert res.returncode != 0
    assert "speculative exited before it was ready" in res.stderr
    assert "CUDA out of memory (on purpose)" in res.stderr  # the log tail
    logged = next(line for line in res.stderr.splitlines() if "speculative config:" in line)
    config = json.loads(logged.split("speculative config: ", 1)[1])
    assert {k: config[k] for k in expected} == expected
    assert not (tmp_path / "run" / "baseline.log").exists()  # never started
    assert not list((tmp_path / "run").glob("*.pid"))


def test_launch_refuses_a_pair_that_does_not_fit(
    tmp_path: Path, models: tuple[Path, Path], env: dict[str, str]
) -> None:
    target, _ = models
    res = run(
        ["bash", str(GPU / "launch.sh"), "--model", str(target), "--gpu-mib", "24000"],
        timeout=30,
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode != 0
    assert "does not fit" in res.stderr
    assert not list(Path(env["FAKE_VLLM_RECORD_DIR"]).iterdir())


@pytest.mark.parametrize("routes", [(), ("none", "ngram:2", "ngram:4")], ids=["pair", "three"])
def test_validate_runs_the_whole_gpu_check(
    tmp_path: Path, models: tuple[Path, Path], env: dict[str, str], routes: tuple[str, ...]
) -> None:
    """validate.sh end to end: the servers (the pair, or one per --route), the gateway
    on launch.sh's [routes.*] config, bench (stand-in), scrapes, teardown."""
    target, draft = models
    *ports, gw_port = _free_ports(max(len(routes), 2) + 1)
    out = tmp_path / "out"
    if routes:
        names = ["none", "ngram-k2", "ngram-k4"]
        where = ["--ports", ",".join(map(str, ports))]
        for route in routes:
            where += ["--route", route]
    else:
        names = ["speculative", "baseline"]
        where = ["--draft", str(draft), "--spec-port", str(ports[0]), "--base-port", str(ports[1])]
    res = run(
        ["bash", str(GPU / "validate.sh"), "--model", str(target), "--out", str(out),
         "--gateway-port", str(gw_port), *where, "--gpu-mib", H200_MIB, "--budget", "120"],
        timeout=150,
        env={**env, "SPECROUTE": f"{sys.executable} {HERE / 'fake_specroute.py'}"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    bench = json.loads((out / "bench.json").read_text())
    assert bench["workload"] == "mixed"
    assert bench["concurrency"] == [1, 16]
    assert list(bench["targets"]) == [*names, "gateway"]
    assert bench["targets"]["gateway"]["url"] == f"http://127.0.0.1:{gw_port}"
    assert bench["targets"]["gateway"]["route"] in names
    assert (out / "bench.png").read_bytes().startswith(b"\x89PNG")
    for name in ("summary.txt", "env.txt", "launch.log", "gateway.log", "bench.log"):
        assert (out / name).stat().st_size > 0, name
    for name in names:
        assert (out / "run" / f"{name}.log").exists()
    assert list(tomllib.loads((out / "run" / "gateway.toml").read_text())["routes"]) == names
    for when in ("before", "after"):
        for name in ("gateway", *names):
            assert (out / "metrics" / f"{when}-{name}.txt").stat().st_size > 0
    after = (out / "metrics" / "after-gateway.txt").read_text()
    assert "specroute_requests_total{" in after
    summary = (out / "summary.txt").read_text()
    assert "servers ready after" in summary and "exit status 0" in summary
    assert "0.32.0 (fake_vllm for tests)" in (out / "env.txt").read_text()
    # Everything it started is gone.
    for port in (*ports, gw_port):
        assert not _port_open(port), port


def test_the_bench_interface_validate_uses_matches_specroute_bench() -> None:
    """`specroute bench` takes the flags validate.sh passes."""
    specroute = Path(sys.executable).with_name("specroute")
    res = run([str(specroute), "bench", "--help"], timeout=60)
    assert res.returncode == 0, res.stderr
    for flag in ("--target", "--workload", "--concurrency", "--json", "--plot"):
        assert flag in res.stdout, f"specroute bench has no {flag}: update deploy/gpu/validate.sh"


def test_validate_help_documents_itself() -> None:
    res = subprocess.run(
        ["bash", str(GPU / "validate.sh"), "--help"], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0
    assert "specroute bench --target baseline=URL" in res.stderr


def _launch(
    args: list[str], env: dict[str, str], run_dir: Path
) -> subprocess.CompletedProcess[str]:
    cmd = ["bash", str(GPU / "launch.sh"), *args, "--run-dir", str(run_dir), "--timeout", "30"]
    return run(cmd, timeout=90, env=env)


def test_launch_three_routes_on_one_gpu_one_after_another(
    tmp_path: Path, models: tuple[Path, Path], env: dict[str, str]
) -> None:
    """--route x3: one server per route on one GPU, each started once the previous
    answers, sized together; the gateway's config names them as [routes.NAME]."""
    target, draft = models
    ports = _free_ports(3)
    run_dir = tmp_path / "run"
    routes = ["none", "ngram:2", f"eagle3:3@{draft}"]
    args = ["--model", str(target), "--ports", ",".join(map(str, ports)), "--gpu-mib", H200_MIB]
    for route in routes:
        args += ["--route", route]
    res = _launch(args, env, run_dir)
    try:
        assert res.returncode == 0, res.stderr
        names = ["none", "ngram-k2", "eagle3-k3"]
        assert res.stdout.splitlines() == [
            f"{name}=http://127.0.0.1:{port}" for name, port in zip(names, ports, strict=True)
        ]
        records = [_records(env, port) for port in ports]
        argv = [cast(list[str], rec["argv"]) for rec in records]
        # One GPU: one at a time, in order.
        for before, after in itertools.pairwise(records):
            assert after["started"] >= before["ready"]  # type: ignore[operator]
        # The split is plan_servers' for these three on this GPU.
        plan = plan_servers(
            int(H200_MIB) / 1024,
            15,
            [Server("none"), Server("ngram-k2", True), Server("eagle3-k3", True, 2)],
        )
        utils = [float(_flag(a, "--gpu-memory-utilization")) for a in argv]
        assert utils == [share.gpu_memory_utilization for share in plan.shares]
        assert "--speculative-config" not in argv[0]
        configs = [json.loads(_flag(a, "--speculative-config")) for a in argv[1:]]
        assert configs == [
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4,
             "prompt_lookup_min": 2},
            {"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3},
        ]  # fmt: skip
        assert all(rec["env"]["CUDA_VISIBLE_DEVICES"] == "0" for rec in records)  # type: ignore[index]
        toml = tomllib.loads((run_dir / "gateway.toml").read_text())
        assert list(toml["routes"]) == names
        assert toml["routes"]["ngram-k2"] == {
            "urls": [f"http://127.0.0.1:{ports[1]}"], "method": "ngram",
            "num_speculative_tokens": 2,
        }  # fmt: skip
        assert toml["routes"]["none"]["method"] == "none"
    finally:
        down = run(["bash", str(GPU / "down.sh"), "--run-dir", str(run_dir)], timeout=60)
    assert down.returncode == 0, down.stderr
    assert not any(_port_open(port) for port in ports)
    assert not list(run_dir.glob("*.pid"))


def test_launch_one_route_per_gpu_starts_them_together(
    tmp_path: Path, models: tuple[Path, Path], env: dict[str, str]
) -> None:
    target, _ = models
    a, b = _free_ports(2)
    args = ["--model", str(target), "--route", "none", "--route", "ngram:8", "--gpus", "0,1",
            "--ports", f"{a},{b}", "--gpu-mib", H200_MIB]  # fmt: skip
    res = _launch(args, env, tmp_path / "run")
    try:
        assert res.returncode == 0, res.stderr
        first, second = _records(env, a), _records(env, b)
        # A GPU each: no wait for the other.
        assert second["started"] < first["ready"]  # type: ignore[operator]
        assert first["env"]["CUDA_VISIBLE_DEVICES"] == "0"  # type: ignore[index]
        assert second["env"]["CUDA_VISIBLE_DEVICES"] == "1"  # type: ignore[index]
        alone = plan_servers(int(H200_MIB) / 1024, 15, [Server("one")]).shares[0]
        for rec in (first, second):
            util = float(_flag(rec["argv"], "--gpu-memory-utilization"))  # type: ignore[arg-type]
            assert util == alone.gpu_memory_utilization
    finally:
        run(["bash", str(GPU / "down.sh"), "--run-dir", str(tmp_path / "run")], timeout=60)


def test_launch_refuses_routes_that_do_not_fit_or_repeat(
    tmp_path: Path, models: tuple[Path, Path], env: dict[str, str]
) -> None:
    target, _ = models
    base = ["bash", str(GPU / "launch.sh"), "--model", str(target), "--gpu-mib", H200_MIB]
    # Eight 15 GiB targets with their overheads, reserves and KV cache exceed an H200.
    many = [arg for k in range(1, 9) for arg in ("--route", f"ngram:{k}")]
    res = run([*base, *many], timeout=30, env=env, cwd=tmp_path)
    assert res.returncode != 0 and "does not fit" in res.stderr
    res = run(
        [*base, "--route", "ngram:2", "--route", "ngram:2"], timeout=30, env=env, cwd=tmp_path
    )
    assert res.returncode != 0 and "repeat" in res.stderr
    res = run([*base, "--route", "eagle3:3"], timeout=30, env=env, cwd=tmp_path)
    assert res.returncode != 0 and "needs a draft folder" in res.stderr
    assert not list(Path(env["FAKE_VLLM_RECORD_DIR"]).iterdir())
