"""`specroute bench` flags -> BenchOptions, and the run (optionally on an emulated stack).

    specroute bench --target baseline=URL --target speculative=URL --target gateway=URL
        [--workload mixed|demo|real|NAME[,NAME...]|FILE.jsonl]
        [--concurrency 1,4,16 | --rate 2,8 | --replay-timing [--time-scale X]]
        [--requests N] [--duration S] [--json OUT.json] [--plot OUT.png]
    specroute bench --emulate ...      # the three targets on EMULATED backends, in-process
    specroute bench --emulate --with-dynamic [--dynamic-schedule JSON] ...
                                       # and a fourth: one EMULATED dynamic-SD server
    specroute bench --target route:none=URL --target route:eagle3-k3=URL ... \
        --target gateway=URL [--target gateway-2:eagle3-k3=URL] ...
                                       # N routes: every static route, the gateways, the oracle
    specroute bench --emulate --routes none,eagle3:3,eagle3:7,ngram:8 [--pair-with NAME,...]
                                       # the same on N EMULATED servers on one GPU

The target names baseline, speculative, gateway and dynamic carry meaning
(speedups are against "baseline", acceptance is read from "speculative", the
oracle and regret need the first three; "dynamic", one vLLM server with dynamic
speculative decoding, is compared with the oracle and the gateway and its
acceptance is read from its own counters); any other name is benched and
compared to the baseline. N routes: targets route:NAME (each route's server alone),
gateway (over all routes) and gateway-*; the oracle is then over every route, the
speedups against the best static route (tooling/bench/routes.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

from gateway.commands import Help
from gateway.config import ConfigError, normalize_backend_url
from tooling.bench import BenchOptions, BenchOutcome, run_bench
from tooling.bench.plan import builtin_names, is_file, parse_list
from tooling.bench.routes import ROUTE_PREFIX
from tooling.bench.stats import DYNAMIC
from tooling.datasets import require as require_dataset
from tooling.emulator.config import DEFAULT_GPU_PROFILE, add_gpu_arguments, drafter_names
from tooling.emulator.dynamic import Schedule, schedule_arg
from tooling.local_stack import EmulatedRoute, pair_members

HELP = Help(
    "drive a workload at baseline, speculative and gateway side by side; table, JSON, PNG",
    "Drive the same requests at every target and compare them paired: speedup over the "
    "baseline, acceptance, the per-request oracle and the gateway's regret, each with "
    "its 95% bootstrap interval.",
    (
        "specroute bench --emulate --concurrency 1,8 --json bench.json --plot bench.png",
        "specroute bench --target baseline=http://gpu:8002 --target "
        "speculative=http://gpu:8001 --target gateway=http://127.0.0.1:8080 --workload code",
        "specroute bench --target gateway=http://127.0.0.1:8080 --target "
        "baseline=http://gpu:8002 --workload requests.jsonl --replay-timing",
    ),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="an OpenAI-compatible server (repeat): baseline=, speculative=, gateway=, ...",
    )
    p.add_argument(
        "--emulate",
        action="store_true",
        help="bench two EMULATED vLLM servers and a gateway started in-process",
    )
    p.add_argument(
        "--emulator-time-scale", type=float, default=1.0, help="with --emulate: time scale"
    )
    add_gpu_arguments(p)
    p.add_argument(
        "--with-dynamic",
        action="store_true",
        help="with --emulate: also bench target 'dynamic', ONE EMULATED vLLM server with "
        "dynamic speculative decoding (K per batch size) on a GPU of its own, no gateway",
    )
    p.add_argument(
        "--dynamic-schedule",
        type=schedule_arg,
        metavar="JSON",
        help="with --with-dynamic: its num_speculative_tokens_per_batch_size, as vLLM's "
        "--speculative-config takes it, e.g. '[[1,4,4],[5,16,2],[17,256,0]]' "
        "(default: the emulator's)",
    )
    p.add_argument(
        "--routes",
        metavar="ROUTE,ROUTE,...",
        help="with --emulate: N routes instead of the pair, each an EMULATED server on ONE "
        "GPU: none or DRAFTER:K (DRAFTER eagle3, draft-1b or ngram), e.g. "
        "none,eagle3:3,eagle3:7,ngram:8, or a dynamic-speculation server DRAFTER:K@SCHEDULE "
        "(vLLM's num_speculative_tokens_per_batch_size in JSON, or 'dynamic' for the "
        "emulator's; route DRAFTER-kK-dynamic); benched alone (target route:NAME, NAME e.g. "
        "eagle3-k3), behind a gateway over all of them (gateway) and behind a two-route "
        "gateway of none and each other route (gateway-2:NAME)",
    )
    p.add_argument(
        "--pair-with",
        metavar="NAME,...",
        help="with --routes: the two-route gateways to start: NAME (none and route NAME) "
        "or A+B (routes A and B), comma-separated (default: none with each speculative "
        "route)",
    )
    p.add_argument(
        "--workload",
        default="mixed",
        help="a mix (mixed, demo, real), workload names (synthetic: structured, sql, code, "
        "creative, rag, chat; real traffic, with specroute-tools[traffic]: sharegpt, humaneval, "
        "json-extract) comma-separated, or a JSONL of request bodies / recorded requests "
        "(default: mixed)",
    )
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", help="closed loop: requests in flight, e.g. 1,4,16,64")
    load.add_argument("--rate", help="open loop: Poisson arrivals, requests/s, e.g. 2,8")
    load.add_argument(
        "--replay-timing",
        action="store_true",
        help="open loop at the recording's own arrival times (JSONL from [record])",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="with --replay-timing: multiply the recorded gaps (0.5 = twice the rate)",
    )
    p.add_argument(
        "--requests",
        type=int,
        help="requests per cell and target (default: max(8, 2 x concurrency); 16 at a "
        "rate; the whole file for a JSONL)",
    )
    p.add_argument("--duration", type=float, help="seconds per cell and target (instead)")
    p.add_argument("--model", help="model name to send (default: what /v1/models serves)")
    p.add_argument("--seed", type=int, default=0, help="workload bodies and arrival times")
    p.add_argument("--json", type=Path, help="write the results as JSON here")
    p.add_argument("--plot", type=Path, help="write a PNG summary here (needs matplotlib)")
    p.add_argument(
        "--spec-metrics",
        metavar="URL",
        help="speculative server whose /metrics counters to read (default: the speculative target)",
    )
    p.add_argument(
        "--read-timeout", type=float, default=600.0, help="longest silence within one answer"
    )


def options(args: argparse.Namespace, argv: list[str]) -> BenchOptions:
    targets: dict[str, str] = {}
    for item in args.target:
        name, sep, url = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--target {item!r}: expected NAME=URL")
        if name.strip() in targets:
            raise ConfigError(f"--target {name}: given twice")
        targets[name.strip()] = normalize_backend_url(url.strip(), f"--target {name}")
    if args.plot is not None:  # now, not after the whole run
        from tooling.bench.plot import PlotUnavailable, pyplot

        try:
            pyplot()
        except PlotUnavailable as exc:
            raise ConfigError(f"bench: {exc}") from None
    if (args.routes or args.pair_with) and not args.emulate:
        raise ConfigError(
            "--routes starts EMULATED servers and needs --emulate (real ones: "
            "--target route:NAME=URL per route, --target gateway=URL)"
        )
    if not targets and not args.emulate:
        raise ConfigError("bench: give --target NAME=URL (repeatable) or --emulate")
    if args.with_dynamic and not args.emulate:
        raise ConfigError(
            "--with-dynamic starts an EMULATED dynamic server and needs --emulate "
            "(a real one: --target dynamic=URL)"
        )
    if args.with_dynamic and DYNAMIC in targets:
        raise ConfigError("--with-dynamic and --target dynamic=URL: give one of them")
    if args.pair_with and not args.routes:
        raise ConfigError("--pair-with needs --routes")
    if args.routes and args.with_dynamic:
        raise ConfigError("--routes and --with-dynamic: give one of them")
    if args.routes:
        try:
            routes = emulated_routes(args.routes)
            measured = drafter_names(args.gpu_profile)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if unknown := [r.drafter for r in routes if r.drafter and r.drafter not in measured]:
            raise ConfigError(
                f"--routes: {', '.join(unknown)}: want none or DRAFTER:K, DRAFTER one the GPU "
                f"profile measured ({', '.join(measured)})"
            )
        names = [r.name for r in routes]
        pairs = [n.strip() for n in (args.pair_with or "").split(",") if n.strip()]
        members = {p: pair_members(p, "none") for p in pairs}
        if bad := [p for p, (a, b) in members.items() if a == b or not {a, b} <= set(names)]:
            raise ConfigError(
                f"--pair-with {', '.join(bad)}: want a speculative route of --routes (paired "
                f"with none) or A+B, two of them ({', '.join(names)})"
            )
    if args.dynamic_schedule is not None and not args.with_dynamic:
        raise ConfigError("--dynamic-schedule needs --with-dynamic")
    if not is_file(args.workload):
        try:
            for name in builtin_names(args.workload):
                require_dataset(name)  # before --emulate starts anything
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if args.replay_timing and not is_file(args.workload):
        raise ConfigError("--replay-timing needs --workload FILE.jsonl (recorded requests)")
    if args.requests is not None and args.requests < 1:
        raise ConfigError("--requests must be >= 1")
    if (args.duration is not None and args.duration <= 0) or args.time_scale <= 0:
        raise ConfigError("--duration and --time-scale must be > 0")
    try:
        concurrency = [int(c) for c in parse_list(args.concurrency or "1", int, "--concurrency")]
        rates = parse_list(args.rate, float, "--rate") if args.rate else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return BenchOptions(
        targets=targets,
        workload=args.workload,
        concurrency=concurrency,
        rates=rates,
        replay_timing=args.replay_timing,
        time_scale=args.time_scale,
        requests=args.requests,
        duration_s=args.duration,
        model=args.model,
        seed=args.seed,
        json_path=args.json,
        plot_path=args.plot,
        spec_metrics_url=normalize_backend_url(args.spec_metrics) if args.spec_metrics else None,
        read_timeout_s=args.read_timeout,
        command=["specroute", "bench", *argv],
    )


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from gateway.telemetry import configure_logging

    configure_logging("warning")
    return main(args, argv)


def main(args: argparse.Namespace, argv: list[str]) -> int:
    """Exit status: 0; 1 if any request failed; 3 if the plot could not be drawn; 130 on ^C."""
    opts = options(args, argv)
    stack = None
    if args.emulate:
        stack = EmulatedStack(
            args.emulator_time_scale,
            args.with_dynamic,
            args.dynamic_schedule,
            args.gpu_profile,
            args.drafter,
            emulated_routes(args.routes) if args.routes else (),
            tuple(n.strip() for n in args.pair_with.split(",")) if args.pair_with else None,
        )
    try:
        outcome = asyncio.run(_run(opts, stack))
    except KeyboardInterrupt:
        print("specroute bench: interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError) as exc:  # an unreadable or malformed --workload file
        print(f"specroute bench: {exc}", file=sys.stderr)
        return 2
    if outcome.failures:
        return 1
    return 3 if outcome.plot_error else 0


@dataclass(frozen=True, slots=True)
class EmulatedStack:
    """--emulate: what to start in-process before the bench."""

    time_scale: float = 1.0
    with_dynamic: bool = False
    dynamic_schedule: Schedule | None = None  # None: the emulator's default schedule
    gpu_profile: str = DEFAULT_GPU_PROFILE
    drafter: str = "draft-1b"
    routes: tuple[EmulatedRoute, ...] = ()  # --routes: N routes instead of the pair
    pair_with: tuple[str, ...] | None = None  # their two-route gateways (None: every one)


def emulated_routes(text: str) -> tuple[EmulatedRoute, ...]:
    # A comma inside a schedule's brackets (eagle3:4@[[1,8,4],[9,256,1]]) does not split.
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    routes = tuple(EmulatedRoute.parse(t) for t in items if t.strip())
    names = [r.name for r in routes]
    if len(routes) < 2 or len(set(names)) != len(names) or "none" not in names:
        raise ValueError(f"--routes: want none and one route or more, each once; got {text!r}")
    return routes


async def _run(opts: BenchOptions, emulated: EmulatedStack | None) -> BenchOutcome:
    if emulated is None:
        return await run_bench(opts)
    if emulated.routes:
        return await _run_routes(opts, emulated)
    from dataclasses import replace

    from tooling.emulator.cli import describe_dynamic
    from tooling.local_stack import local_stack

    async with local_stack(
        time_scale=emulated.time_scale,
        with_dynamic=emulated.with_dynamic,
        dynamic_schedule=emulated.dynamic_schedule,
        gpu_profile=emulated.gpu_profile,
        drafter=emulated.drafter,
    ) as stack:
        targets = {"baseline": stack.baseline, "speculative": stack.speculative}
        if stack.dynamic is not None and stack.dynamic_emulator is not None:
            targets[DYNAMIC] = stack.dynamic
            print(
                "specroute bench: target dynamic is EMULATED: "
                + describe_dynamic(stack.dynamic_emulator),
                file=sys.stderr,
                flush=True,
            )
        targets["gateway"] = stack.gateway
        return await run_bench(replace(opts, targets={**targets, **opts.targets}))


async def _run_routes(opts: BenchOptions, emulated: EmulatedStack) -> BenchOutcome:
    """--emulate --routes: every route alone, the N-route gateway and the two-route ones."""
    from dataclasses import replace

    import aiohttp

    from tooling.bench.targets import wait_for_profile
    from tooling.emulator.costs import describe_gpu
    from tooling.local_stack import routes_stack

    async def ready(url: str) -> None:  # one gateway's profile at a time on the one GPU
        await wait_for_profile(aiohttp.ClientSession, url, sys.stderr)

    names = ", ".join(r.name for r in emulated.routes)
    print(
        f"specroute bench: EMULATED routes {names}, a server each on ONE emulated GPU, "
        "no model runs; starting the gateways one at a time (each measures its profile)",
        file=sys.stderr,
        flush=True,
    )
    async with routes_stack(
        emulated.routes,
        time_scale=emulated.time_scale,
        gpu_profile=emulated.gpu_profile,
        seed=opts.seed,
        pairs_with=emulated.pair_with,
        ready=ready,
    ) as stack:
        for name, emulator in stack.emulators.items():
            print(
                f"specroute bench: route {name} is EMULATED: {describe_gpu(emulator)}",
                file=sys.stderr,
                flush=True,
            )
        targets = {f"{ROUTE_PREFIX}{n}": url for n, url in stack.servers.items()}
        targets |= stack.gateways
        return await run_bench(replace(opts, targets={**targets, **opts.targets}))
