"""A real Prometheus server on 127.0.0.1 scrapes a running gateway and two
emulated vLLM servers, with deploy/prometheus/prometheus.yml's jobs and
labels and its alert rules loaded, and answers PromQL about what was sent.

Everything runs in this test: the emulated backends and the gateway on
ephemeral ports (aiohttp AppRunner/TCPSite), Prometheus as a subprocess
(Debian's `prometheus` package) with a 1 s scrape and rule interval."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from gateway.app import create_app
from gateway.config import parse_config
from tests.deploy.conftest import DEPLOY
from tests.deploy.promql_names import all_expressions
from tests.support import require_tool, wait_until
from tooling.emulator import EmulatorConfig, create_emulator_app

PROM = DEPLOY / "prometheus"
MODEL = "smollm2-135m"
# route -> (requests sent with that override header, of which streamed)
SENT = {"speculative": (5, 3), "baseline": (3, 2)}


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prometheus_config(tmp: Path, gateway: int, spec: int, base: int) -> Path:
    """deploy/prometheus/prometheus.yml with these targets and 1 s intervals."""
    config: dict[str, Any] = yaml.safe_load((PROM / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    config["rule_files"] = [str(PROM / f) for f in config["rule_files"]]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    jobs["specroute-gateway"]["static_configs"][0]["targets"] = [f"127.0.0.1:{gateway}"]
    by_route = {sc["labels"]["route"]: sc for sc in jobs["vllm"]["static_configs"]}
    by_route["speculative"]["targets"] = [f"127.0.0.1:{spec}"]
    by_route["baseline"]["targets"] = [f"127.0.0.1:{base}"]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.asynccontextmanager
async def _prometheus(binary: str, config: Path, tmp: Path) -> AsyncIterator[str]:
    port = _free_port()
    log = (tmp / "prometheus.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
        stdout=log,
        stderr=log,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()


async def _query(session: aiohttp.ClientSession, base: str, promql: str) -> list[dict[str, Any]]:
    async with session.get(f"{base}/api/v1/query", params={"query": promql}) as resp:
        payload = await resp.json()
    assert payload["status"] == "success", payload
    return payload["data"]["result"]  # type: ignore[no-any-return]


async def _eventually(check: Any, what: str) -> Any:
    """Prometheus answers `check`'s assertions within 20 s (a 1 s scrape interval)."""
    return await wait_until(
        check, what, timeout_s=20, interval_s=0.5, ignoring=(AssertionError, aiohttp.ClientError)
    )


async def test_prometheus_scrapes_the_gateway_and_answers_promql(tmp_path: Path) -> None:
    binary = require_tool("prometheus", "scripts/test.sh apt-installs Debian's prometheus")

    runners: list[web.AppRunner] = []
    try:
        ports = {}
        for mode in ("speculative", "baseline"):
            emulator = create_emulator_app(EmulatorConfig(mode=mode, model=MODEL, time_scale=0.02))
            runner, ports[mode] = await _serve(emulator)
            runners.append(runner)
        config = parse_config(
            {
                "backends": {
                    "speculative": {"urls": [f"http://127.0.0.1:{ports['speculative']}"]},
                    "baseline": {"urls": [f"http://127.0.0.1:{ports['baseline']}"]},
                },
                "upstream": {"health_interval_s": 0.5},
            }
        )
        runner, gateway_port = await _serve(create_app(config))
        runners.append(runner)
        gateway = f"http://127.0.0.1:{gateway_port}"

        prom_config = _prometheus_config(
            tmp_path, gateway_port, ports["speculative"], ports["baseline"]
        )
        async with (
            _prometheus(binary, prom_config, tmp_path) as prom,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        ):

            async def all_targets_up() -> list[dict[str, Any]]:
                up = await _query(session, prom, "up")
                assert len(up) == 3 and all(r["value"][1] == "1" for r in up), up
                return up

            up = await _eventually(all_targets_up, "the three targets up")

            async def send(route: str, i: int) -> None:
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"Say hello #{i}."}],
                    "max_tokens": 16,
                    "stream": i < SENT[route][1],
                }
                async with session.post(
                    f"{gateway}/v1/chat/completions",
                    json=body,
                    headers={"x-specroute-route": route},
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    assert resp.headers["x-specroute-route"] == route
                    await resp.read()

            # Traffic through the gateway, both routes (override header), streamed
            # and not: one request each first, so that the series exist when
            # Prometheus scrapes, then the rest, so that rate() sees them grow.
            for route in SENT:
                await send(route, 0)
            await _eventually(
                lambda: _nonzero(session, prom, "sum(specroute_requests_total) == 2"),
                "the first two requests scraped",
            )
            for route, (count, _) in SENT.items():
                for i in range(1, count):
                    await send(route, i)

            query = "sum by (route) (specroute_requests_total)"

            async def counted() -> list[dict[str, Any]]:
                result = await _query(session, prom, query)
                got = {r["metric"]["route"]: float(r["value"][1]) for r in result}
                assert got == {route: float(n) for route, (n, _) in SENT.items()}, got
                return result

            result = await _eventually(counted, "every request counted by route")
            await _eventually(
                lambda: _nonzero(session, prom, "sum(rate(specroute_requests_total[10s]))"),
                "a non-zero request rate",
            )
            # The vLLM job's route label, on the emulator's real vLLM metric names.
            drafts = await _eventually(
                lambda: _nonzero(
                    session,
                    prom,
                    'sum by (route) (vllm:spec_decode_num_draft_tokens_total{job="vllm"})',
                ),
                "draft tokens on the vLLM job",
            )
            # The alert rules load and evaluate without error on live data.
            rules = await _eventually(
                lambda: _rules_evaluated(session, prom), "the alert rules evaluated"
            )
            # Every dashboard and rule expression runs on live data without error
            # (binary-operator matching errors show only at evaluation).
            empty = set()
            for where, expr in all_expressions():
                if not await _query(session, prom, expr.replace("[5m]", "[10s]")):
                    empty.add(where)

        print(f"\nPromQL> {query}\n{json.dumps(result, indent=1)}")
        print(f"up: {[(r['metric']['job'], r['metric'].get('route')) for r in up]}")
        print(f"draft tokens by route: {[(r['metric']['route'], r['value'][1]) for r in drafts]}")
        print(f"rules evaluated: {len(rules)}, all health=ok")
        print(f"dashboard + rule expressions: all ran; without data: {sorted(empty)}")
        # Only the alerts (none fires) and the error panels (no errors) must be
        # empty; of the router's panels, those that need conditions this short
        # run does not create (predictions: its routes are forced by header;
        # failovers; two scrapes with drafts; shadow copies, which forced routes
        # never get; latency targets, which no request here sends) may be.
        panels_empty = {w.split(":")[1] for w in empty if w.startswith("specroute.json")}
        errors = {"Server errors", "Requests by status", "Upstream errors"}
        may_be_empty = {
            "Measured / predicted latency (p50)",
            "Failovers",
            "KV cache and acceptance (router's scrape)",
            "Shadow copies by outcome",
            "Live speedup per workload (shadow pairs)",
            "Live regret of the router (shadow pairs)",
            "Latency targets met (goodput)",
            "Latency targets by outcome",
        }
        assert errors <= panels_empty <= errors | may_be_empty, panels_empty
        assert {r["metric"]["route"] for r in drafts} == {"speculative"}
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


async def _nonzero(session: aiohttp.ClientSession, prom: str, promql: str) -> list[dict[str, Any]]:
    result = await _query(session, prom, promql)
    assert result and all(float(r["value"][1]) > 0 for r in result), result
    return result


async def _rules_evaluated(session: aiohttp.ClientSession, prom: str) -> list[dict[str, Any]]:
    async with session.get(f"{prom}/api/v1/rules") as resp:
        payload = await resp.json()
    rules = [r for g in payload["data"]["groups"] for r in g["rules"]]
    assert len(rules) == 13
    for r in rules:
        assert r["health"] == "ok", r
        assert not r["lastEvaluation"].startswith("0001"), r["name"]
    return rules
