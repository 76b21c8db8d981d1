"""The speculation configurations launch.sh starts, one vLLM server per route: their
names, --speculative-config, ports, GPUs and memory shares, and the gateway config
that routes among them ([routes.NAME] tables).

A route is `[NAME=]METHOD[:K][@DRAFT_DIR]` or `NAME={...}` (a whole
--speculative-config as JSON):

    none                       no speculation (route "none")
    ngram:2                    n-gram prompt lookup, k=2 (route "ngram-k2")
    eagle3:3@/models/eagle3    an EAGLE3 head, k=3 (route "eagle3-k3")
    draft:4                    a draft model (--draft DIR), k=4 (route "draft-k4")
    mtp                        the target's own MTP layers, k=1 (route "mtp-k1")
    spec=draft_model:4         any name: the two-route pair is speculative=...,baseline=none

Routes go round-robin over --gpus: with as many GPUs as routes, one configuration
per GPU; with one GPU, all of them share it (sizing.plan_servers). Servers of one
GPU start one after the other (their `wave`): vLLM's memory profiling assumes no
other process changes the GPU's memory meanwhile.

Pure stdlib, like sizing.py:

    python3 deploy/gpu/routes.py --model DIR --route none --route ngram:2 \\
        --route eagle3:3@/models/eagle3 --gpu-mib 143771 --format table|plan|toml
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__:
    from deploy.gpu import sizing
else:  # run as a script: python3 deploy/gpu/routes.py
    import sizing

# vLLM's --speculative-config methods launch.sh knows, with the k each starts with
# when none is given: 4 for n-gram and a draft model (vLLM's examples), 3 for EAGLE
# heads (EAGLE-3's paper), 1 for MTP (one MTP layer in DeepSeek-V3's checkpoints).
DEFAULT_K = {"ngram": 4, "draft_model": 4, "eagle": 3, "eagle3": 3, "mtp": 1}
NEEDS_DRAFT = frozenset({"draft_model", "eagle", "eagle3"})
ALIASES = {"draft": "draft_model", "baseline": "none", "off": "none"}
# n-gram lookup window (vLLM's own defaults are max 4 / min 1; min 2 skips
# one-token matches, which propose mostly noise).
NGRAM_LOOKUP = {"prompt_lookup_max": 4, "prompt_lookup_min": 2}
# A route's name is a config table key, an Envoy cluster, a header value, a
# Prometheus label value and a Kubernetes name: lower-case letters, digits, dashes.
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_SPEC = re.compile(
    r"^(?:(?P<name>[^=]+)=)?(?P<method>[a-z0-9_]+)(?::(?P<k>\d+))?(?:@(?P<draft>.+))?$"
)


class RouteError(ValueError):
    """A route that cannot be started as written."""


@dataclass(frozen=True, slots=True)
class RouteSpec:
    """One speculation configuration: what its vLLM server is started with."""

    name: str
    method: str  # "none" or vLLM's method
    k: int = 0
    draft: str | None = None  # the folder --speculative-config's model names
    config: str = ""  # --speculative-config as JSON; "" for none

    @property
    def speculative(self) -> bool:
        return self.method != "none"


def parse_route(text: str, draft: str | None = None) -> RouteSpec:
    """`[NAME=]METHOD[:K][@DRAFT]` or `NAME={json}`; `draft` is --draft's folder."""
    name, sep, rest = text.partition("=")
    if sep and rest.lstrip().startswith("{"):
        return _from_json(name.strip(), rest)
    match = _SPEC.match(text.strip())
    if match is None:
        raise RouteError(f"route {text!r}: write [NAME=]METHOD[:K][@DRAFT_DIR]")
    method = ALIASES.get(match["method"], match["method"])
    if method != "none" and method not in DEFAULT_K:
        known = ", ".join(["none", "draft", *DEFAULT_K])
        raise RouteError(f"route {text!r}: method {match['method']!r} is not one of {known}")
    if method == "none":
        if match["k"] not in (None, "0"):
            raise RouteError(f"route {text!r}: no speculation takes no k")
        return _named(RouteSpec(match["name"] or "none", "none"))
    k = int(match["k"]) if match["k"] is not None else DEFAULT_K[method]
    if k < 1:
        raise RouteError(f"route {text!r}: k must be >= 1")
    folder = match["draft"] or (draft if method in NEEDS_DRAFT else None)
    if method in NEEDS_DRAFT and not folder:
        raise RouteError(f"route {text!r}: {method} needs a draft folder (@DIR or --draft DIR)")
    config: dict[str, object] = {"method": method}
    if method in NEEDS_DRAFT:
        config["model"] = folder
    config["num_speculative_tokens"] = k
    if method == "ngram":
        config.update(NGRAM_LOOKUP)
    label = "draft" if method == "draft_model" else method
    name = match["name"] or f"{label}-k{k}"
    return _named(RouteSpec(name, method, k, folder, json.dumps(config, separators=(",", ":"))))


def _from_json(name: str, text: str) -> RouteSpec:
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise RouteError(f"route {name}: --speculative-config is not JSON: {exc}") from None
    if not isinstance(config, dict) or not isinstance(config.get("method"), str):
        raise RouteError(f'route {name}: the JSON needs a "method"')
    k = config.get("num_speculative_tokens", 1)
    if not isinstance(k, int) or k < 1:
        raise RouteError(f"route {name}: num_speculative_tokens must be an integer >= 1")
    model = config.get("model")
    draft = model if isinstance(model, str) and model.startswith("/") else None
    return _named(RouteSpec(name, config["method"], k, draft, text.strip()))


def _named(route: RouteSpec) -> RouteSpec:
    if route.name == "gateway":  # validate.sh's bench target and metrics file for the gateway
        raise RouteError("route name 'gateway' is taken: validate.sh names the gateway so")
    if not NAME.match(route.name):
        raise RouteError(
            f"route name {route.name!r}: lower-case letters, digits and dashes (a config key,"
            " an Envoy cluster, a label value and a Kubernetes name)"
        )
    return route


@dataclass(frozen=True, slots=True)
class Placed:
    """A route's server: where it listens, its GPU, when it starts, its share."""

    route: RouteSpec
    port: int
    gpu: str
    wave: int  # servers of one GPU start in waves 0, 1, ...: one at a time
    gpu_memory_utilization: float


def place(
    routes: Sequence[RouteSpec],
    *,
    target_gib: float,
    gpu_gib: float | None,
    ports: Sequence[int],
    gpus: Sequence[str] = ("0",),
    utils: Sequence[float] = (),
    draft_gib: dict[str, float] | None = None,
    kv_share: float = sizing.DEFAULT_SPECULATIVE_KV_SHARE,
    overhead_gib: float = sizing.DEFAULT_OVERHEAD_GIB,
    reserve_gib: float = sizing.DEFAULT_RESERVE_GIB,
) -> tuple[list[Placed], list[sizing.GpuPlan]]:
    """Ports in order, GPUs round-robin, each GPU's servers sized together
    (`utils` instead, when given: one per route)."""
    names = [route.name for route in routes]
    if not routes:
        raise RouteError("give at least one --route")
    if len(set(names)) != len(names):
        raise RouteError(f"route names repeat: {names}")
    if len(ports) != len(routes) or len(set(ports)) != len(ports):
        raise RouteError(f"{len(routes)} routes need {len(routes)} different ports, not {ports}")
    if not gpus:
        raise RouteError("give at least one GPU")
    if utils and len(utils) != len(routes):
        raise RouteError(f"{len(routes)} routes need {len(routes)} --utils, not {len(utils)}")
    on = {gpu: [i for i in range(len(routes)) if gpus[i % len(gpus)] == gpu] for gpu in gpus}
    util = dict(enumerate(utils))
    plans = []
    if not utils:
        if gpu_gib is None:
            raise RouteError("give the GPU's memory (--gpu-mib) or one --utils per route")
        drafts = draft_gib or {}
        for members in on.values():
            servers = [
                sizing.Server(
                    routes[i].name, routes[i].speculative, drafts.get(routes[i].draft or "", 0.0)
                )
                for i in members
            ]
            if not servers:
                continue
            plan = sizing.plan_servers(
                gpu_gib, target_gib, servers, overhead_gib=overhead_gib,
                reserve_gib=reserve_gib, speculative_kv_share=kv_share,
            )  # fmt: skip
            plans.append(plan)
            util.update(zip(members, (s.gpu_memory_utilization for s in plan.shares), strict=True))
    placed = [
        Placed(route, ports[i], gpus[i % len(gpus)], on[gpus[i % len(gpus)]].index(i), util[i])
        for i, route in enumerate(routes)
    ]
    return placed, plans


def gateway_toml(placed: Sequence[Placed], host: str) -> str:
    """The gateway's config for these servers: one [routes.NAME] table each, in order;
    on several GPUs each names its device (routes of one GPU are time-sliced)."""
    several = len({p.gpu for p in placed}) > 1
    lines = [
        "# The gateway's routes: one vLLM server each, the same model, started by",
        "# deploy/gpu/launch.sh (table order = route order). Serve it with",
        "# `specroute serve --config THIS_FILE`.",
    ]
    for p in placed:
        lines += ["", f"[routes.{p.route.name}]", f'urls = ["http://{host}:{p.port}"]']
        lines.append(f'method = "{p.route.method}"')
        if p.route.speculative:
            lines.append(f"num_speculative_tokens = {p.route.k}")
        if several:
            lines.append(f'device = "gpu{p.gpu}"')
    return "\n".join(lines) + "\n"


def plan_lines(placed: Sequence[Placed]) -> str:
    """What launch.sh reads: NAME PORT GPU WAVE UTIL [CONFIG], tab-separated."""
    return "".join(
        f"{p.route.name}\t{p.port}\t{p.gpu}\t{p.wave}\t{p.gpu_memory_utilization:.3f}"
        f"\t{p.route.config}\n"
        for p in placed
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="routes.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--route", action="append", default=[], required=True)
    p.add_argument("--model", type=Path, help="the target's folder (weights measured)")
    p.add_argument("--target-gib", type=float, help="instead of --model: its weights in GiB")
    p.add_argument("--draft", help="the draft folder for routes without @DIR")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001, help="the first route's port; then +1 each")
    p.add_argument("--ports", help="instead of --port: one per route, comma-separated")
    p.add_argument("--gpus", default="0", help="GPU ids, comma-separated; routes round-robin")
    p.add_argument("--gpu-mib", type=float, help="memory of each GPU (nvidia-smi memory.total)")
    p.add_argument("--utils", help="one --gpu-memory-utilization per route, instead of sizing")
    p.add_argument("--kv-share", type=float, default=sizing.DEFAULT_SPECULATIVE_KV_SHARE)
    p.add_argument("--overhead-gib", type=float, default=sizing.DEFAULT_OVERHEAD_GIB)
    p.add_argument("--reserve-gib", type=float, default=sizing.DEFAULT_RESERVE_GIB)
    p.add_argument("--format", choices=("table", "plan", "toml"), default="table")
    args = p.parse_args(argv)
    try:
        routes = [parse_route(text, args.draft) for text in args.route]
        if args.ports:
            ports = [int(x) for x in args.ports.split(",")]
        else:
            ports = [args.port + i for i in range(len(routes))]
        utils = [float(x) for x in args.utils.split(",")] if args.utils else []
        target_gib = args.target_gib
        if target_gib is None and not utils:
            if args.model is None:
                raise RouteError("give --model DIR (or --target-gib)")
            target_gib = sizing.weights_gib(args.model)
        drafts = {r.draft: sizing.weights_gib(r.draft) for r in routes if r.draft}
        placed, plans = place(
            routes, target_gib=target_gib or 0.0,
            gpu_gib=args.gpu_mib / 1024 if args.gpu_mib else None,
            ports=ports, gpus=args.gpus.split(","), utils=utils, draft_gib=drafts,
            kv_share=args.kv_share, overhead_gib=args.overhead_gib, reserve_gib=args.reserve_gib,
        )  # fmt: skip
    except (RouteError, sizing.SizingError, ValueError) as exc:
        print(f"routes: {exc}", file=sys.stderr)
        return 2
    if args.format == "plan":
        print(plan_lines(placed), end="")
    elif args.format == "toml":
        print(gateway_toml(placed, args.host), end="")
    else:
        for plan in plans:
            print(plan.table())
        for s in placed:
            print(f"{s.route.name}: GPU {s.gpu}, port {s.port}, config {s.route.config or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
