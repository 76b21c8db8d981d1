"""`specroute profile`: measure the pair now, or show the stored profile."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp

from classifier.profile import Curve, EngineProfile
from classifier.tokens import load_tiktoken_counter
from gateway.config import Config
from gateway.profiling.lifecycle import load_profile, max_batch, reference, save_json, targets
from gateway.profiling.probes import ProbeFailed, identify, measure_profile


def run_profile(config: Config, out: Path | None, *, show: bool) -> int:
    path = str(out) if out is not None else config.routing.profile_path
    if show:
        if not path:
            print("specroute profile: no routing.profile_path and no --out", file=sys.stderr)
            return 2
        stored = load_profile(path)
        if stored is None:
            print(f"specroute profile: no usable profile at {path}", file=sys.stderr)
            return 1
        print(describe(stored))
        return 0
    try:
        profile = asyncio.run(_measure(config))
    except ProbeFailed as exc:
        print(f"specroute profile: {exc}", file=sys.stderr)
        return 1
    if path:
        save_json(path, profile.dumps())
        print(f"written to {path}", file=sys.stderr)
    else:
        sys.stdout.write(profile.dumps())
    print(describe(profile), file=sys.stderr)
    return 0


async def _measure(config: Config) -> EngineProfile:
    tokens = load_tiktoken_counter(config.routing.tokenizer)
    async with aiohttp.ClientSession() as session:
        found, first = targets(config), reference(config)
        ident = await identify(session, first)
        if ident is None:
            raise ProbeFailed(f"{first.name} at {first.url} does not answer /v1/models")
        return await measure_profile(
            session,
            found,
            model=ident.model,
            tokens=tokens,
            max_batch=max_batch(config),
            budget_s=config.routing.profile_budget_s,
            progress=lambda line: print(f"[profile] {line}", file=sys.stderr, flush=True),
            source="emulated" if "emulated" in ident.version else "measured",
        )


def describe(p: EngineProfile) -> str:
    """A few lines a person reads: what was measured, on what."""
    lines = [
        f"engine profile ({p.source}), {p.created}, took {p.took_s:.1f} s, a busy neighbour "
        f"slows a step x{max(r.beside for r in p.routes):.2f} "
        f"({_sharing(p)})"
    ]
    for r in p.routes:
        i = r.identity
        steps = " ".join(
            f"b{x:g}={y * 1000:.1f}ms" for x, y in zip(r.step.xs, r.step.ys, strict=True)
        )
        ttft = " ".join(
            f"{x:g}t={y * 1000:.0f}ms" for x, y in zip(r.ttft.xs, r.ttft.ys, strict=True)
        )
        lines.append(f"  {r.name}: {i.model} vLLM {i.version} at {i.url} ({i.speculative})")
        lines.append(f"    step: {steps}")
        lines.append(f"    first token: {ttft}")
        if p.neighbours(r.name):
            lines.append(f"    beside a busy neighbour: x{r.beside:.2f} its step alone")
        else:
            lines.append(f"    alone on its device ({i.device}): no neighbour slows it")
        if r.tokens_per_step:
            tps = ", ".join(f"{w.value} {v[0]:.2f}" for w, v in sorted(r.tokens_per_step.items()))
            lines.append(f"    tokens per step: {tps}")
    lines.extend(f"  missing: {m}" for m in p.missing)
    return "\n".join(lines)


def _sharing(p: EngineProfile) -> str:
    """How the routes share devices: one GPU, a GPU each, or by the configured devices."""
    groups = p.devices()
    if len(groups) == 1:
        return "one GPU" if p.shared_gpu else "a GPU each"
    device = {r.name: r.identity.device for r in p.routes}
    return "; ".join(
        f"{device[g[0]]}: {', '.join(g)}" + (" time-sliced" if p.shared(g) else "") for g in groups
    )


def _points(curve: Curve) -> list[tuple[float, float]]:
    return list(zip(curve.xs, curve.ys, strict=True))
