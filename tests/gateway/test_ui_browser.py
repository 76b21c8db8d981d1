"""/ui in a real browser: Debian's headless Chromium, driven by Playwright, against
emulated vLLM servers and the gateway on 127.0.0.1: the two-route configuration
(speculative, baseline), and three routes by name (none, ngram-k2, ngram-k4), whose
columns the page builds from /stats.

The emulator makes the speculative server faster on structured output (drafts
accepted ~80% per position) and slower on creative text at temperature 1.2
(~25%), so run one after the other, as the page's fair mode does, the faster side
of each preset is known. Run at once on one emulated GPU the two servers take
turns step by step, and the side that yields more tokens per step wins whatever
its step costs: that mode is checked to run, not for who wins.

Figures the page showed are printed (`pytest -s`); a screenshot of each preset
goes to the test's tmp_path, and to $SPECROUTE_UI_SCREENSHOT if set (the
README's docs/ui.png is made that way, from the three-route run). The layout at
2, 3 and 4 routes is checked by the columns' boxes at three window widths.
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
from tests.gateway.three_routes import three_route_stack
from tests.support import require_tool, wait_until
from tooling.bench.targets import wait_for_profile
from tooling.emulator import EmulatorConfig, SharedGpu, create_emulator_app
from tooling.local_stack import MODEL, gateway_config, local_stack, serve_app

# serial: a browser, and the page's verdict on which emulated server was faster
pytestmark = [pytest.mark.slow, pytest.mark.serial]

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

# What the page shows, read from its DOM: per column (in the page's order) its
# state, message and raw figures (data-value), the decision panel with its row per
# route, and the verdict.
READ_PAGE = """() => {
  const side = (el) => {
    const figures = {};
    for (const dd of el.querySelectorAll("dd[data-figure]")) {
      figures[dd.dataset.figure] = dd.dataset.value === undefined
        ? dd.textContent : Number(dd.dataset.value);
    }
    return {state: el.dataset.state, message: el.querySelector(".message").textContent,
            faster: el.classList.contains("faster"), chosen: el.classList.contains("chosen"),
            kind: el.querySelector("h2 .kind").textContent,
            predicted: el.querySelector(".predicted").textContent.trim(), figures,
            output: el.querySelector(".output").textContent.length};
  };
  const columns = [...document.querySelectorAll("#sides .side")];
  const decision = document.getElementById("decision");
  const rows = {};
  for (const tr of decision.querySelectorAll("#prediction-table tbody tr")) {
    const row = {chosen: tr.classList.contains("chosen")};
    for (const td of tr.querySelectorAll("td[data-key]")) row[td.dataset.key] = td.textContent;
    rows[tr.dataset.route] = row;
  }
  const verdict = document.getElementById("verdict");
  const json = (text) => (text ? JSON.parse(text) : null);
  return {
    order: columns.map((el) => el.dataset.route),
    sides: Object.fromEntries(columns.map((el) => [el.dataset.route, side(el)])),
    decision: {state: decision.dataset.state, route: decision.dataset.route || null,
               reason: decision.dataset.reason || null, rows,
               summary: document.getElementById("decision-summary").textContent},
    verdict: {faster: verdict.dataset.faster || null, right: verdict.dataset.right || null,
              measured: json(verdict.dataset.measured),
              predicted: json(verdict.dataset.predicted), text: verdict.textContent},
    health: document.getElementById("health").textContent,
  };
}"""
# Each column's box, and whether the page scrolls sideways (it must not).
LAYOUT = """() => ({
  boxes: [...document.querySelectorAll("#sides .side")].map((el) => {
    const r = el.getBoundingClientRect();
    return {route: el.dataset.route, x: r.x, y: r.y, width: r.width, height: r.height};
  }),
  overflow: document.documentElement.scrollWidth - window.innerWidth,
})"""
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


async def open_page(browser: Browser, url: str, width: int = 1280) -> tuple[Page, list[str]]:
    """The page at `url`, and the list its console errors and script errors go to
    (a CSP violation, a blocked request or an exception lands there)."""
    page = await browser.new_page(viewport={"width": width, "height": 900})
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


def check_finished_with_figures(
    shown: dict[str, Any], speculative: tuple[str, ...], plain: tuple[str, ...]
) -> None:
    """Every column finished with its figures; the routes in `plain` draft nothing."""
    assert sorted(shown["sides"]) == sorted(speculative + plain)
    for route, side in shown["sides"].items():
        assert side["state"] == "done", (route, side)
        figures = side["figures"]
        assert 0 < figures["ttft"] < figures["e2e"], (route, figures)
        assert figures["tokens"] > 0 and figures["tps"] > 0, (route, figures)
        assert side["output"] > 0
    for route in speculative:
        figures = shown["sides"][route]["figures"]
        assert 0 <= figures["acceptance"] <= 1 and figures["length"] >= 1, (route, figures)
    for route in plain:  # drafts nothing: marked, not blank
        figures = shown["sides"][route]["figures"]
        assert figures["acceptance"].startswith("not reported"), (route, figures)
        assert figures["length"].startswith("not reported"), (route, figures)
    decision = shown["decision"]
    assert decision["state"] == "decided" and decision["route"] in shown["sides"]
    assert [r for r, row in decision["rows"].items() if row["chosen"]] == [decision["route"]]
    assert [r for r, s in shown["sides"].items() if s["chosen"]] == [decision["route"]]


def summary(preset: str, shown: dict[str, Any]) -> dict[str, Any]:
    """The figures the page showed, for the log of the run."""
    measured = shown["verdict"]["measured"] or {}
    return {
        "preset": preset,
        "decision": [shown["decision"]["route"], shown["decision"]["reason"]],
        "predicted_speedup": shown["verdict"]["predicted"],
        "measured_speedup": {r: round(v, 3) for r, v in measured.items()},
        **{
            route: {
                k: round(v, 4) if isinstance(v, float) else v for k, v in side["figures"].items()
            }
            for route, side in shown["sides"].items()
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
            check_finished_with_figures(shown, ("speculative",), ("baseline",))
            assert shown["order"] == ["speculative", "baseline"]
            verdict = shown["verdict"]
            assert verdict["faster"] == faster, verdict
            assert [r for r, side in shown["sides"].items() if side["faster"]] == [faster]
            assert verdict["measured"]["baseline"] == 1  # over the route without speculation
            assert (verdict["measured"]["speculative"] > 1) == (faster == "speculative"), verdict
            assert verdict["predicted"]["speculative"] > 0  # the cost model predicts latencies
            await screenshot(page, tmp_path / f"ui-{preset}.png")
        together = await run(page, "json", "together")  # runs; who wins is the GPU's turn-taking
        check_finished_with_figures(together, ("speculative",), ("baseline",))
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
            assert refused["sides"][route]["state"] == "error"
            assert refused["sides"][route]["message"] == f"400: {message}"

        down = await run(page, "json", "together", temperature="0")
        spec, base = down["sides"]["speculative"], down["sides"]["baseline"]
        assert spec["state"] == "down"
        assert "speculative is down" in spec["message"]
        assert spec["output"] == 0  # not the other server's answer
        assert base["state"] == "done"
        assert base["figures"]["tokens"] > 0
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
        check_finished_with_figures(shown, ("speculative",), ("baseline",))
        assert await page.evaluate(NO_STORAGE) == 0  # no storage, no cookie
        assert await page.input_value("#key") == ""
        assert "the-right-key" not in await page.content()
        # A new page load forgets it: the key lived in the old page's memory only.
        await page.reload()
        await page.wait_for_selector("#key-form:not([hidden])")


THREE = ("none", "ngram-k2", "ngram-k4")


async def profiled(gateway: str) -> None:
    """Until the gateway's start-up profile of every route is in use (its probes
    done, each route measured: /stats says so)."""

    async def in_use() -> bool:
        async with aiohttp.ClientSession() as session, session.get(f"{gateway}/stats") as resp:
            profile = (await resp.json())["profile"]
        return bool(profile["in_use"])

    await wait_until(in_use, "the profile of every route", timeout_s=120, interval_s=0.2)


async def test_three_routes_stream_side_by_side_with_the_choice_and_why(
    browser: Browser, tokens: TokenCounter, tmp_path: Path
) -> None:
    """Three routes by name: a column each in the configuration's order, labelled
    with its speculation; the dry run's row per route; every stream measured; the
    verdict's fastest the one whose e2e was least."""
    async with three_route_stack(time_scale=1.0, tokens=tokens) as stack:
        await profiled(stack.gateway)  # the page's timings must not run beside the probes
        page, errors = await open_page(browser, stack.gateway)
        await page.wait_for_selector("#side-ngram-k4")
        await page.wait_for_selector("#live-table tbody tr[data-workload=structured]")
        head = await page.inner_text("#live-table thead")
        assert "none / ngram-k2 / ngram-k4" in head
        assert "acceptance, ngram-k2" in head and "acceptance, ngram-k4" in head
        for preset in ("json", "code"):
            shown = await run(page, preset, "sequential")
            print("ui figures:", json.dumps(summary(preset, shown)))
            assert shown["order"] == list(THREE)
            assert [s["kind"] for s in shown["sides"].values()] == [
                "none",
                "ngram k=2",
                "ngram k=4",
            ]
            check_finished_with_figures(shown, ("ngram-k2", "ngram-k4"), ("none",))
            e2e = {r: side["figures"]["e2e"] for r, side in shown["sides"].items()}
            verdict = shown["verdict"]
            assert verdict["faster"] == min(e2e, key=lambda r: e2e[r]), (verdict, e2e)
            assert [r for r, side in shown["sides"].items() if side["faster"]] == [
                verdict["faster"]
            ]
            assert verdict["measured"]["none"] == 1 and set(verdict["measured"]) == set(THREE)
            for route in ("ngram-k2", "ngram-k4"):
                assert verdict["measured"][route] == pytest.approx(e2e["none"] / e2e[route])
                assert verdict["predicted"][route] > 0
            rows = shown["decision"]["rows"]
            assert list(rows) == list(THREE)
            assert all(row["predicted"].endswith(" s") for row in rows.values())
            assert rows["none"]["acceptance"] == "no drafts"
            assert all(
                side["predicted"].startswith("predicted ") for side in shown["sides"].values()
            )
            await screenshot(
                page, tmp_path / f"ui-3-routes-{preset}.png", for_readme=preset == "json"
            )
        live = await page.inner_text("#live-table")
        assert "structured\t1 / 1 / 1" in live  # one json run on each, forced by the header
        assert errors == []
        print("screenshots:", *(tmp_path / f"ui-3-routes-{p}.png" for p in ("json", "code")))


@pytest.mark.parametrize("ks", [(0, 4), (0, 2, 4), (0, 2, 4, 6)], ids=["2", "3", "4"])
async def test_the_columns_fit_side_by_side_and_wrap_when_narrow(
    browser: Browser, tokens: TokenCounter, tmp_path: Path, ks: tuple[int, ...]
) -> None:
    """At 1280 px every column of 2, 3 or 4 sits side by side; narrower they wrap onto
    more rows, one column wide at phone width; the page never scrolls sideways."""
    async with three_route_stack(
        time_scale=1.0, tokens=tokens, ks=ks, routing={"profile": "off"}
    ) as stack:
        page, errors = await open_page(browser, stack.gateway)
        await page.wait_for_selector(f"#sides[data-count='{len(ks)}']")
        for width in (1280, 760, 420):
            await page.set_viewport_size({"width": width, "height": 900})
            layout = await page.evaluate(LAYOUT)
            boxes = layout["boxes"]
            assert len(boxes) == len(ks) and layout["overflow"] <= 0, (width, layout)
            rows = len({round(b["y"]) for b in boxes})
            widest = max(b["width"] for b in boxes)
            assert min(b["width"] for b in boxes) >= min(250, width - 40), (width, boxes)
            if width == 1280:
                assert rows == 1, boxes  # all side by side
            elif width == 420:
                assert rows == len(ks) and widest <= width, boxes  # one per row
            else:
                assert 1 < rows < len(ks) or len(ks) == 2, boxes
            await page.screenshot(
                path=str(tmp_path / f"layout-{len(ks)}-{width}.png"), full_page=True
            )
        assert errors == []
        print("layout screenshots:", tmp_path)
