"""/ui on emulated servers, in headless Chromium: EMULATED on every surface of the page,
with the GPU profile the timing models; nothing of it in front of a real server; and the
page's own runs counted under reason "ui", apart from clients' overrides.

The emulated run is the README's screenshot: `specroute serve --emulate --config
docs/ui-routes.toml` run as a process, exactly as the caption says, the JSON preset run
one route after the other; the picture goes to $SPECROUTE_UI_SCREENSHOT if set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from playwright.async_api import Browser, Page

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.config import parse_config
from tests.gateway.test_ui_browser import browser, open_page, profiled, run
from tooling.local_stack import serve_app, wait_healthy

pytestmark = [pytest.mark.slow, pytest.mark.serial]
__all__ = ["browser"]  # the fixture: headless Chromium, as test_ui_browser launches it

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "docs" / "ui-routes.toml"
ROUTES = ("none", "eagle3-k3", "ngram-k4")

# Every surface that says EMULATED, and whether it shows.
SURFACES = """() => {
  const shown = (el) => !!el && el.offsetParent !== null && getComputedStyle(el).display !== "none";
  return {
    title: document.title,
    banner: shown(document.getElementById("emulated"))
      ? document.getElementById("emulated").textContent : null,
    heading: shown(document.querySelector("h1 .emulated-tag")),
    decision: shown(document.querySelector("#decision h2 .emulated-tag")),
    live: shown(document.querySelector("#live h2 .emulated-tag")),
    footer: shown(document.querySelector("footer .emulated-note")),
    columns: Object.fromEntries([...document.querySelectorAll("#sides .side")].map(
      (el) => [el.dataset.route, shown(el.querySelector(".emulated-tag"))
        ? el.querySelector(".emulated-tag").title : null])),
  };
}"""


@contextlib.asynccontextmanager
async def serve_emulate_config(config: Path, port: int) -> AsyncIterator[str]:
    """`specroute serve --emulate --config FILE` as a process; its gateway's URL."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--emulate",
        "--config",
        str(config),
        "--port",
        str(port),
        "--log-level",
        "warning",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_healthy(url, timeout_s=60)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def stats(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/stats") as resp:
        body: dict[str, Any] = await resp.json()
        return body


async def surfaces(page: Page) -> dict[str, Any]:
    shown: dict[str, Any] = await page.evaluate(SURFACES)
    return shown


async def test_serve_emulate_config_says_emulated_everywhere_and_counts_clicks_apart(
    browser: Browser, tmp_path: Path, unused_tcp_port: int
) -> None:
    async with serve_emulate_config(CONFIG, unused_tcp_port) as gateway:
        await profiled(gateway)  # the page's timings must not run beside the probes
        page, errors = await open_page(browser, gateway)
        await page.wait_for_selector("body[data-emulated=true]")
        await page.wait_for_selector("#live-table tbody tr[data-workload=structured]")
        shown = await surfaces(page)
        assert shown["title"].startswith("EMULATED · "), shown
        assert shown["banner"].startswith("EMULATED: Every route's server is an emulated"), shown
        assert "measured GPU h200-llama3.1-8b (NVIDIA H200" in shown["banner"], shown
        assert shown["heading"] and shown["decision"] and shown["live"] and shown["footer"]
        assert list(shown["columns"]) == list(ROUTES)
        assert shown["columns"]["none"].endswith("not vLLM)"), shown  # no drafter on it
        assert shown["columns"]["eagle3-k3"].endswith("drafter eagle3 k=3"), shown
        assert shown["columns"]["ngram-k4"].endswith("drafter ngram k=4"), shown

        result = await run(page, "json", "sequential")
        assert [s["state"] for s in result["sides"].values()] == ["done"] * 3, result
        assert result["verdict"]["text"].startswith("EMULATED servers: modelled timing"), result
        reasons = (await stats(gateway))["reasons"]
        assert reasons.get("ui") == 3 and "override" not in reasons, reasons
        # A client's forced route is still an override.
        body = {"model": "emulated-model", "messages": [{"role": "user", "content": "hi"}]}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{gateway}/v1/chat/completions",
                json=body | {"max_tokens": 4},
                headers={"x-specroute-route": "ngram-k4"},
            ) as resp,
        ):
            assert resp.status == 200 and resp.headers["x-specroute-reason"] == "override"
            await resp.read()
        reasons = (await stats(gateway))["reasons"]
        assert reasons.get("ui") == 3 and reasons.get("override") == 1, reasons
        await page.screenshot(path=str(tmp_path / "ui.png"), full_page=True)
        if target := os.environ.get("SPECROUTE_UI_SCREENSHOT"):
            await page.screenshot(path=target, full_page=True)
        assert errors == []
        print("screenshot:", tmp_path / "ui.png")


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": "0.32.0"})


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "real-model"}]})


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="")


async def test_in_front_of_real_servers_the_page_says_nothing_of_emulation(
    browser: Browser, tokens: TokenCounter
) -> None:
    """Servers whose /version is a plain vLLM one: no tag, no banner, the usual title."""
    runners: list[web.AppRunner] = []
    try:
        urls = []
        for _ in range(2):
            app = web.Application()
            app.router.add_get("/version", _version)
            app.router.add_get("/v1/models", _models)
            app.router.add_get("/health", _ok)
            app.router.add_get("/metrics", _ok)
            runner, url = await serve_app(app)
            runners.append(runner)
            urls.append(url)
        config = parse_config(
            {
                "routes": {
                    "none": {"urls": [urls[0]]},
                    "ngram-k4": {"urls": [urls[1]], "method": "ngram", "num_speculative_tokens": 4},
                },
                "routing": {"profile": "off"},
            }
        )
        runner, gateway = await serve_app(create_app(config, tokens=tokens))
        runners.append(runner)
        page, errors = await open_page(browser, gateway)
        await page.wait_for_selector("body[data-emulated=false]")
        shown = await surfaces(page)
        assert shown["title"] == "specroute: side by side", shown
        assert shown["banner"] is None and not shown["heading"] and not shown["footer"], shown
        assert shown["columns"] == {"none": None, "ngram-k4": None}, shown
        assert errors == []
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
