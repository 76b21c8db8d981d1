"""/ui in a real browser: Debian's headless Chromium, driven by Playwright, against
two emulated vLLM servers and the gateway on 127.0.0.1.

The emulator makes the speculative server faster on structured output (drafts
accepted ~80% per position) and slower on creative text at temperature 1.2
(~25%), so run one after the other, as the page's fair mode does, the faster side
of each preset is known. Run at once on one emulated GPU the two servers take
turns step by step, and the side that yields more tokens per step wins whatever
its step costs: that mode is checked to run, not for who wins.

Figures the page showed are printed (`pytest -s`); a screenshot of each preset
goes to the test's tmp_path, and to $SPECROUTE_UI_SCREENSHOT if set (the
README's docs/ui.png is made that way).
"""

from __future__ import annotations

import io
import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, Page, async_playwright

from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.app import create_app
from gateway.state import BACKENDS
from tests.support import require_tool, wait_until
from tooling.bench.targets import wait_for_profile
from tooling.emulator import EmulatorConfig, SharedGpu, create_emulator_app
from tooling.local_stack import MODEL, gateway_config, local_stack, serve_app

pytestmark = pytest.mark.slow

# Without the background-networking flags Chromium keeps calling out to a
# network this machine does not have; Playwright gives it a fresh profile.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RUN_TIMEOUT_MS = 60_000

# What the page shows, read from its DOM: per side its state, message and the
# raw figures (data-value), the decision panel and the verdict.
READ_PAGE = """() => {
  const side = (route) => {
    const el = document.getElementById("side-" + route);
    const figures = {};
    for (const dd of el.querySelectorAll("dd[data-figure]")) {
      figures[dd.dataset.figure] = dd.dataset.value === undefined
        ? dd.textContent : Number(dd.dataset.value);
    }
    return {state: el.dataset.state, message: el.querySelector(".message").textContent,
            faster: el.classList.contains("faster"), figures,
            output: el.querySelector(".output").textContent.length};
  };
  const decision = document.getElementById("decision");
  const predicted = {};
  for (const dd of decision.querySelectorAll("dd[data-key]")) {
    predicted[dd.dataset.key] = dd.textContent;
  }
  const verdict = document.getElementById("verdict");
  return {
    speculative: side("speculative"), baseline: side("baseline"),
    decision: {state: decision.dataset.state, route: decision.dataset.route || null,
               reason: decision.dataset.reason || null, predicted,
               summary: document.getElementById("decision-summary").textContent},
    verdict: {faster: verdict.dataset.faster || null, right: verdict.dataset.right || null,
              measured: Number(verdict.dataset.measured || NaN),
              predicted: Number(verdict.dataset.predicted || NaN), text: verdict.textContent},
    health: document.getElementById("health").textContent,
  };
}"""
NO_STORAGE = "() => localStorage.length + sessionStorage.length + document.cookie.length"


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    chromium = require_tool("chromium", "scripts/test.sh installs Debian's chromium")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


async def open_page(browser: Browser, url: str) -> tuple[Page, list[str]]:
    """The page at `url`, and the list its console errors and script errors go to
    (a CSP violation, a blocked request or an exception lands there)."""
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    await page.goto(f"{url}/ui")
    await page.wait_for_selector("body[data-ready=true]")
    return page, errors


async def run(page: Page, preset: str, mode: str, **fields: str) -> dict[str, Any]:
    """Choose a preset and mode, change `fields` (element id -> text), Run, wait, read."""
    await page.click(f"#presets button[data-preset={preset}]")
    await page.check(f"input[name=mode][value={mode}]")
    for element, text in fields.items():
        await page.fill(f"#{element}", text)
    await page.click("#run")
    # (a selector, not wait_for_function: the page's CSP forbids evaluating strings)
    await page.wait_for_selector("body[data-run=finished]", timeout=RUN_TIMEOUT_MS)
    shown: dict[str, Any] = await page.evaluate(READ_PAGE)
    return shown


def check_finished_with_figures(shown: dict[str, Any]) -> None:
    for route in ("speculative", "baseline"):
        side = shown[route]
        assert side["state"] == "done", (route, side)
        figures = side["figures"]
        assert 0 < figures["ttft"] < figures["e2e"], (route, figures)
        assert figures["tokens"] > 0 and figures["tps"] > 0, (route, figures)
        assert side["output"] > 0
    spec = shown["speculative"]["figures"]
    assert 0 <= spec["acceptance"] <= 1 and spec["length"] >= 1
    base = shown["baseline"]["figures"]  # the baseline drafts nothing: marked, not blank
    assert base["acceptance"].startswith("not reported")
    assert base["length"].startswith("not reported")
    assert shown["decision"]["state"] == "decided"
    assert shown["decision"]["route"] in ("speculative", "baseline")


def summary(preset: str, shown: dict[str, Any]) -> dict[str, Any]:
    """The figures the page showed, for the log of the run."""
    return {
        "preset": preset,
        "decision": [shown["decision"]["route"], shown["decision"]["reason"]],
        "predicted_speedup": shown["verdict"]["predicted"],
        "measured_speedup": round(shown["verdict"]["measured"], 3),
        **{
            route: {
                k: round(v, 4) if isinstance(v, float) else v
                for k, v in shown[route]["figures"].items()
            }
            for route in ("speculative", "baseline")
        },
    }


async def screenshot(page: Page, path: Path, *, for_readme: bool = False) -> None:
    await page.screenshot(path=str(path), full_page=True)
    if for_readme and (target := os.environ.get("SPECROUTE_UI_SCREENSHOT")):
        await page.screenshot(path=target, full_page=True)


async def test_structured_and_creative_presets_side_by_side(
    browser: Browser, tokens: TokenCounter, tmp_path: Path
) -> None:
    async with local_stack(time_scale=1.0, tokens=tokens) as stack:
        # The gateway's start-up profile probes both servers: the page's timings
        # must not run beside them.
        await wait_for_profile(aiohttp.ClientSession, stack.gateway, io.StringIO())
        page, errors = await open_page(browser, stack.gateway)
        await page.wait_for_selector("#live-table tbody tr[data-workload=structured]")
        assert await page.input_value("#model") == MODEL  # from /v1/models
        for preset, faster in (("json", "speculative"), ("poem", "baseline")):
            shown = await run(page, preset, "sequential")
            print("ui figures:", json.dumps(summary(preset, shown)))
            check_finished_with_figures(shown)
            verdict = shown["verdict"]
            assert verdict["faster"] == faster, verdict
            assert shown[faster]["faster"] and not shown[Route(faster).other]["faster"]
            assert (verdict["measured"] > 1) == (faster == "speculative"), verdict
            assert verdict["predicted"] > 0  # the cost model predicts latencies
            await screenshot(page, tmp_path / f"ui-{preset}.png", for_readme=preset == "json")
        together = await run(page, "json", "together")  # runs; who wins is the GPU's turn-taking
        check_finished_with_figures(together)
        assert "at once" in together["verdict"]["text"]
        live = await page.inner_text("#live-table")
        assert "structured\t2 / 2" in live and "creative\t1 / 1" in live
        assert "not measured" in live  # no live speedup without shadow copies
        assert errors == []
        print("screenshots:", tmp_path / "ui-json.png", tmp_path / "ui-poem.png")


async def test_the_live_table_shows_the_shadow_pairs_speedup(
    browser: Browser, tokens: TokenCounter
) -> None:
    """Shadow copies of every request (share 1.0): the page's live speedup column
    shows each workload's paired speedup and its number of pairs, as /stats gives it."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Return the user Ada, 36, as JSON."}],
        "response_format": {"type": "json_object"},
        "temperature": 0,
        "max_tokens": 40,
    }
    async with (
        local_stack(time_scale=0.1, tokens=tokens, shadow={"share": 1.0}) as stack,
        aiohttp.ClientSession() as session,
    ):
        await wait_for_profile(aiohttp.ClientSession, stack.gateway, io.StringIO())
        for i in range(3):  # one at a time: each copy runs in the idle time after it
            async with session.post(f"{stack.gateway}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()

            async def copied(n: int = i + 1) -> dict[str, Any] | None:
                async with session.get(f"{stack.gateway}/stats") as resp:
                    stats: dict[str, Any] = await resp.json()
                return stats if stats["speedup"]["pairs"] >= n else None

            stats = await wait_until(copied, "the copy to pair with its request")
        speedup = stats["workloads"]["structured"]["speedup"]
        page, errors = await open_page(browser, stack.gateway)
        row = page.locator("#live-table tbody tr[data-workload=structured]")
        await row.wait_for()
        assert (await row.inner_text()).endswith(f"{speedup:.2f}x (3)")
        creative = await page.inner_text("#live-table tbody tr[data-workload=creative]")
        assert creative.endswith("not measured")
        assert "3 shadow pairs" in await page.inner_text("#live-notes")
        assert errors == []


def closed_port_url() -> str:
    """An address where nothing listens: the speculative server is down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_a_refused_prompt_and_a_down_backend_show_on_their_sides(
    browser: Browser, tokens: TokenCounter
) -> None:
    emulator = EmulatorConfig(mode="baseline", model=MODEL)
    base_runner, base_url = await serve_app(create_emulator_app(emulator, SharedGpu()))
    config = gateway_config(
        closed_port_url(), base_url, emulator, upstream={"health_interval_s": 0.2}
    )
    app = create_app(config, tokens=tokens)
    gateway_runner, gateway_url = await serve_app(app)
    try:
        spec = app[BACKENDS].of(Route.SPECULATIVE)
        await wait_until(lambda: not spec.healthy, "the prober to see the speculative server down")
        page, errors = await open_page(browser, gateway_url)

        refused = await run(page, "json", "together", temperature="-1")
        message = "'temperature' must be >= 0"
        assert refused["decision"]["state"] == "error"
        assert message in refused["decision"]["summary"]
        for route in ("speculative", "baseline"):
            assert refused[route]["state"] == "error"
            assert refused[route]["message"] == f"400: {message}"

        down = await run(page, "json", "together", temperature="0")
        assert down["speculative"]["state"] == "down"
        assert "speculative is down" in down["speculative"]["message"]
        assert down["speculative"]["output"] == 0  # not the other server's answer
        assert down["baseline"]["state"] == "done"
        assert down["baseline"]["figures"]["tokens"] > 0
        assert down["verdict"]["faster"] is None and "did not finish" in down["verdict"]["text"]
        assert "speculative DOWN" in down["health"]
        # The two 400s are expected console errors (the browser logs failed fetches).
        assert all("400" in e for e in errors), errors
    finally:
        await gateway_runner.cleanup()
        await base_runner.cleanup()


async def test_with_auth_the_page_asks_for_a_key_and_keeps_it_in_memory(
    browser: Browser, tokens: TokenCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UI_BROWSER_KEYS", "the-right-key")
    async with local_stack(
        time_scale=0.2, tokens=tokens, auth={"api_keys_env": "UI_BROWSER_KEYS"}
    ) as stack:
        page, _ = await open_page(browser, stack.gateway)
        await page.wait_for_selector("#key-form:not([hidden])")
        await page.fill("#key", "a-wrong-key")
        await page.click("#key-form button")
        await page.wait_for_selector("#key-error:has-text('refused')")
        await page.fill("#key", "the-right-key")
        await page.click("#key-form button")
        await page.wait_for_selector("#key-form", state="hidden")
        await page.wait_for_selector("#live-table tbody tr[data-workload=structured]")
        shown = await run(page, "sql", "sequential")
        check_finished_with_figures(shown)
        assert await page.evaluate(NO_STORAGE) == 0  # no storage, no cookie
        assert await page.input_value("#key") == ""
        assert "the-right-key" not in await page.content()
        # A new page load forgets it: the key lived in the old page's memory only.
        await page.reload()
        await page.wait_for_selector("#key-form:not([hidden])")
