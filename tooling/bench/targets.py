"""What answered: probe each target before the bench, so no report mistakes the emulator for a GPU.

A target is whatever speaks the OpenAI API: vLLM, the emulated vLLM, or the
gateway. The probe reads /v1/models (the served model), /version and /metrics.
The emulator says what it is in two places a real vLLM never does: its
/version is "...+emulated" and its model card's permission id is
"modelperm-emulated" (its /emulator/state then says its mode: baseline,
speculative, or dynamic with its K schedule); the gateway relays its backends' model cards, so a
gateway in front of emulators is recognised too. Its /metrics is also
recognisable as the emulator's: vLLM series without the process_/python_
series and without vllm:cache_config_info that a real vLLM exposes. The
gateway is recognised by its own specroute_* series.

vllm:cache_config_info (a real vLLM's KV-cache size and memory share) is kept
for `specroute advise`: what the speculative server's memory costs.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import aiohttp

from gateway.backends.scraper import Scrape, acceptance_between, parse_metrics

_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>.*)\}")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_CACHE_KEYS = (
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "kv_cache_size_tokens",
    "num_gpu_blocks",
    "block_size",
    "cache_dtype",
)


@dataclass(slots=True)
class TargetInfo:
    name: str
    url: str
    model: str | None = None
    kind: str = "unknown"  # "vllm" | "emulated vllm" | "specroute gateway" | "unknown"
    emulated: bool = False
    version: str | None = None
    cache_config: dict[str, str] | None = None
    problems: list[str] = field(default_factory=list)
    engine: str | None = None  # an emulator's mode (and K schedule), from /emulator/state

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        bits = [self.kind.upper() if self.emulated else self.kind]
        if self.kind == "specroute gateway" and self.emulated:
            bits = ["specroute gateway over EMULATED backends"]
        if self.engine:
            bits.append(self.engine)
        if self.version:
            bits.append(f"version {self.version}")
        bits.append(f"model {self.model or '?'}")
        bits += self.problems
        return f"{self.name:<12} {self.url}  ({', '.join(bits)})"


async def probe(session: aiohttp.ClientSession, name: str, url: str) -> TargetInfo:
    info = TargetInfo(name, url)
    models = await _get_json(session, f"{url}/v1/models")
    cards = models.get("data") if isinstance(models, dict) else None
    if isinstance(cards, list) and cards and isinstance(cards[0], dict):
        info.model = str(cards[0].get("id"))
        info.emulated = "modelperm-emulated" in repr(cards)
    else:
        info.problems.append("no /v1/models")
    version = await _get_json(session, f"{url}/version")
    if isinstance(version, dict) and isinstance(version.get("version"), str):
        info.version = version["version"]
        info.emulated = info.emulated or "emulated" in info.version
    text = await _get_text(session, f"{url}/metrics")
    if text is None:
        info.problems.append("no /metrics")
    elif "specroute_requests_total" in text or "specroute_route_decisions_total" in text:
        info.kind = "specroute gateway"
    elif "vllm:" in text:
        info.cache_config = cache_config(text)
        looks_emulated = "process_cpu_seconds_total" not in text and info.cache_config is None
        info.emulated = info.emulated or looks_emulated
        info.kind = "emulated vllm" if info.emulated else "vllm"
        if info.emulated:
            info.engine = emulated_engine(await _get_json(session, f"{url}/emulator/state"))
    return info


def emulated_engine(state: Any) -> str | None:
    """An emulator's engine in words: "mode speculative k=4", "mode dynamic, K per ..."."""
    if not isinstance(state, dict) or not isinstance(state.get("mode"), str):
        return None
    text = f"mode {state['mode']}"
    gpu = f", on the {state['gpu']}" if isinstance(state.get("gpu"), str) else ""
    schedule = state.get("num_speculative_tokens_per_batch_size")
    if schedule is not None:
        return f"{text}, K per batch size {json.dumps(schedule)}{gpu}"
    if state.get("num_speculative_tokens") is not None:
        text += f" k={state['num_speculative_tokens']}"
    return text + gpu


def cache_config(metrics_text: str) -> dict[str, str] | None:
    """The memory-related labels of vllm:cache_config_info, if the server exposes it."""
    for line in metrics_text.splitlines():
        if (match := _INFO.match(line)) is not None:
            labels = dict(_LABEL.findall(match["labels"]))
            return {k: labels[k] for k in _CACHE_KEYS if k in labels}
    return None


async def scrape(session: aiohttp.ClientSession, url: str) -> Scrape | None:
    text = await _get_text(session, f"{url}/metrics")
    return None if text is None else parse_metrics(text, time.monotonic())


def acceptance_json(before: Scrape | None, after: Scrape | None) -> dict[str, float] | None:
    """vLLM's counters between two scrapes: accepted / proposed draft tokens."""
    if before is None or after is None:
        return None
    acc = acceptance_between(before, after)
    if acc is None:
        return None
    return {
        "rate": round(acc.rate, 4),
        "mean_length": round(acc.mean_length, 4),
        "draft_tokens": acc.draft_tokens,
    }


async def kv_usage(session: aiohttp.ClientSession, url: str) -> float | None:
    got = await scrape(session, url)
    return None if got is None else got.kv_usage


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            return await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def _get_text(session: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            return await resp.text() if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return None


async def wait_for_profile(
    session_factory: Callable[[], aiohttp.ClientSession],
    gateway: str,
    out: TextIO,
    timeout_s: float = 180.0,
) -> None:
    """Wait until a specroute gateway's engine profile is in (its probes are then over,
    so none overlaps a timed request), and say what it measured. A gateway whose
    policy keeps no profile answers at once."""
    began = time.monotonic()
    found: dict[str, Any] = {}
    said = False
    stage = None
    async with session_factory() as session:
        while True:
            async with session.get(f"{gateway}/stats") as resp:
                stats: dict[str, Any] = await resp.json() if resp.status == 200 else {}
            found = stats.get("profile") or {}
            if not found or found.get("in_use") or time.monotonic() > began + timeout_s:
                break
            if not said:
                print(
                    "profile: waiting for the gateway to measure its servers before the first "
                    f"timed request (at most {timeout_s:.0f} s)",
                    file=out,
                    flush=True,
                )
                said = True
            if found.get("measuring") not in (None, stage):  # "step i of N: what"
                stage = found["measuring"]
                print(f"profile: {stage}", file=out, flush=True)
            await asyncio.sleep(0.2)
    if said:
        print(f"profile: waited {time.monotonic() - began:.1f} s", file=out, flush=True)
    if not found:
        return
    profile = found.get("profile")
    if profile is None:
        print("profile: not in (the gateway routes on its built-in prior)", file=out, flush=True)
        return
    tps = "; ".join(
        f"{r['name']}: " + ", ".join(f"{w} {v[0]:.2f}" for w, v in r["tokens_per_step"].items())
        for r in profile["routes"]
        if r.get("tokens_per_step")  # the speculative routes
    )
    beside = ", ".join(f"{r['name']} x{r['beside']:.2f}" for r in profile["routes"])
    print(
        f"profile ({profile['source']}): {profile['took_s']:.1f} s, a busy neighbour slows "
        f"a step {beside} (2: one time-sliced GPU), tokens per speculative step: {tps}",
        file=out,
        flush=True,
    )
