"""The files the gateway reads at start (routing.state_path, routing.profile_path): whatever
they hold, the gateway starts; a file it cannot use costs one log line, and one it can is
used, whatever routing.profile says about measuring. A path that is no regular file (a
FIFO, a device) is refused at once, never waited on."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from classifier.acceptance_model import FEATURE_NAMES, SCHEMA
from classifier.cost import prior_profile
from classifier.persistence import STATE_FORMAT
from classifier.profile import EngineProfile
from classifier.tokens import TokenCounter
from classifier.types import two_routes
from gateway.app import create_app
from gateway.config import Config, ConfigError
from gateway.profiling.lifecycle import current_identities
from tests.gateway.conftest import ClientFactory, GatewayFactory, make_config
from tests.gateway.test_routing import chat
from tests.support import wait_until

PROFILED = {"policy": "profiled", "profile": "off"}
# A state as ProfiledPolicy.state_to_json writes it (k=4, the config's default).
STATE: dict[str, Any] = {
    "format": STATE_FORMAT,
    "routes": {"speculative": 4, "baseline": 0},
    "acceptance": {
        "speculative/chat/-1": [0.5, 1.0, 0.2, 3.0, 1.8, 1.2],
        "speculative/code/0": [0.6, 2, 0.2, 1, 0.7, 0.5],
    },
    "outputs": {"chat/1": [3.0, 2.1]},
    "failures": {"speculative/chat": [0.5, 4.0]},
    "traffic": {"chat": 4.0, "code": 1.0},
}


def _unusable(logs: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "start_file_unusable" and e["key"] == key]


async def _answers(gateway: TestClient[Any, Any]) -> None:
    """The gateway serves, and its policy decides (a dry run: nothing is forwarded)."""
    assert (await gateway.get("/health")).status == 200
    decided = await gateway.post("/decide/v1/chat/completions", json=chat("hi"))
    assert decided.status == 200, await decided.text()


@pytest.mark.parametrize(
    "content",
    [
        b"[]",
        b"null",
        b"42",
        json.dumps({**STATE, "outputs": []}).encode(),  # a list where a table belongs
        json.dumps({**STATE, "acceptance": {"chat/-1": [0.5, 0.0, 0.2, 0.0, 0.0, 0.0]}}).encode(),
        json.dumps({**STATE, "traffic": {"chat": float("nan")}}).encode(),
        json.dumps({**STATE, "failures": {"speculative/chat": [1, 2**1100]}}).encode(),
        b"\xff\xfe\x00garbage",
        b"[" * 100_000,
    ],
)
async def test_a_state_file_it_cannot_use_costs_one_line(
    gateway_for: GatewayFactory, tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    with capture_logs() as logs:
        gateway = await gateway_for(routing={**PROFILED, "state_path": str(path)})
        await _answers(gateway)
    (line,) = _unusable(logs, "routing.state_path")
    assert line["path"] == str(path) and line["log_level"] == "warning"
    assert "\n" not in line["error"]
    assert not [e for e in logs if e["event"] == "router_state_loaded"]


async def test_a_state_file_it_can_use_is_loaded(
    gateway_for: GatewayFactory, tmp_path: Path
) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(STATE))
    with capture_logs() as logs:
        gateway = await gateway_for(routing={**PROFILED, "state_path": str(path)})
        await _answers(gateway)
    assert [e["event"] for e in logs if "state" in e["event"]] == ["router_state_loaded"]
    assert not _unusable(logs, "routing.state_path")


async def test_a_missing_state_file_is_no_news(gateway_for: GatewayFactory, tmp_path: Path) -> None:
    with capture_logs() as logs:
        await _answers(await gateway_for(routing={**PROFILED, "state_path": str(tmp_path / "no")}))
    assert not [e for e in logs if "state" in e["event"] or "start_file" in e["event"]]


async def _profile_naming(config: Config) -> EngineProfile:
    """The built-in prior's curves, as if measured on exactly these servers."""
    async with aiohttp.ClientSession() as session:
        identities = await current_identities(session, config)
    assert identities is not None
    prior = prior_profile(two_routes(4, 0.1))
    return dataclasses.replace(
        prior,
        routes=tuple(dataclasses.replace(r, identity=identities[r.name]) for r in prior.routes),
        created="2026-01-01T00:00:00+00:00",
        took_s=1.0,
        source="measured",
    )


async def test_profile_off_still_loads_the_stored_profile(
    aiohttp_client: ClientFactory, config: Config, tokens: TokenCounter, tmp_path: Path
) -> None:
    path = tmp_path / "profile.json"
    path.write_text((await _profile_naming(config)).dumps())
    with capture_logs() as logs:
        app = create_app(_with_routing(config, profile_path=str(path)), tokens=tokens)
        gateway = await aiohttp_client(app)
        stats = await wait_until(
            lambda: _stats_profile(gateway), "the stored profile in use", timeout_s=5.0
        )
        decided = await gateway.post("/decide/v1/chat/completions", json=chat("hi"))
    assert stats["profile"] == json.loads(path.read_text())
    assert (await decided.json())["reason"] != "unprofiled"
    assert [e["how"] for e in logs if e["event"] == "profile_in_use"] == ["loaded"]
    assert not [e for e in logs if e["event"] == "profile_started"]  # "off": never measured


async def _stats_profile(gateway: TestClient[Any, Any]) -> dict[str, Any] | None:
    found: dict[str, Any] = (await (await gateway.get("/stats")).json())["profile"]
    return found if found["in_use"] else None


# ---- any content -----------------------------------------------------------------------

numbers = st.one_of(
    st.floats(),  # NaN and the infinities too: Python's json reads and writes them
    st.integers(min_value=-(2**1100), max_value=2**1100),  # past a float's range
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=12)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=10,
)


def _paths(doc: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    children = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    )
    for key, value in children:
        yield from _paths(value, (*at, key))


def _replaced(doc: Any, at: tuple[Any, ...], value: Any) -> Any:
    if not at:
        return value
    out = copy.deepcopy(doc)
    _at(out, at[:-1])[at[-1]] = value
    return out


def contents(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """Bytes, any JSON, and the valid document with one part replaced by any JSON or one
    number by any number (the figures that most often pass the shape's checks)."""
    paths = list(_paths(valid))
    figures = [at for at in paths if isinstance(_at(valid, at), int | float)]
    mutated = st.one_of(
        st.sampled_from(paths).flatmap(lambda at: json_values.map(lambda v: (at, v))),
        st.sampled_from(figures).flatmap(lambda at: numbers.map(lambda v: (at, v))),
    ).map(lambda change: _replaced(valid, *change))
    return st.one_of(
        st.binary(max_size=64),
        json_values.map(lambda v: json.dumps(v).encode()),
        mutated.map(lambda v: json.dumps(v).encode()),
    )


def _at(doc: Any, at: tuple[Any, ...]) -> Any:
    for key in at:
        doc = doc[key]
    return doc


PROPERTY = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@PROPERTY
@given(content=contents(STATE))
async def test_any_state_file_the_gateway_starts_and_decides(
    config: Config, tokens: TokenCounter, tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    config = _with_routing(config, state_path=str(path))
    with capture_logs() as logs:
        async with TestClient(TestServer(create_app(config, tokens=tokens))) as gateway:
            await _answers(gateway)
    fates = [
        e["event"] for e in logs if e["event"] in ("router_state_loaded", "start_file_unusable")
    ]
    assert len(fates) == 1, logs
    event(fates[0])


@PROPERTY
@given(data=st.data())
async def test_any_profile_file_the_gateway_starts_and_decides(
    config: Config, tokens: TokenCounter, tmp_path: Path, data: st.DataObject
) -> None:
    valid = (await _profile_naming(config)).to_json()
    path = tmp_path / "profile.json"
    path.write_bytes(data.draw(contents(valid)))
    config = _with_routing(config, profile_path=str(path))
    ended = ("profile_in_use", "profile_stale", "start_file_unusable")
    with capture_logs() as logs:
        async with TestClient(TestServer(create_app(config, tokens=tokens))) as gateway:
            await wait_until(
                lambda: [e for e in logs if e["event"] in ended], "the profile's fate", timeout_s=5
            )
            await _answers(gateway)
    fates = [e["event"] for e in logs if e["event"] in ended]
    assert len(fates) == 1, logs
    event(fates[0])


def _with_routing(config: Config, **routing: str) -> Config:
    spec, base = config.backends.speculative.urls[0], config.backends.baseline.urls[0]
    return make_config(spec, base, routing={**PROFILED, **routing})


# ---- the operator's files: read the same way, but a refusal is a config error ----------


def _model_with(coefficient: int) -> bytes:
    doc = {
        "schema": SCHEMA,
        "features": list(FEATURE_NAMES),
        "coefficients": [coefficient] * len(FEATURE_NAMES),
        "intercept": 0,
    }
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("key", "content"),
    [
        ("routing.model_path", b"[" * 100_000),
        ("routing.model_path", _model_with(10**400)),  # past a float: OverflowError
        ("routing.model_path", b"\xff\xfe"),
        ("auth.api_keys_file", b"key-\xff\n"),
    ],
)
def test_an_operators_file_it_cannot_use_is_a_config_error_in_one_line(
    config: Config, tokens: TokenCounter, tmp_path: Path, key: str, content: bytes
) -> None:
    """routing.model_path and auth.api_keys_file are named by the operator: refused at
    start (and on SIGHUP), never dropped; whatever they hold, in one line."""
    path = tmp_path / "file"
    path.write_bytes(content)
    table, name = key.split(".")
    spec, base = config.backends.speculative.urls[0], config.backends.baseline.urls[0]
    sections: dict[str, dict[str, object]] = {table: {name: str(path)}}
    if table == "routing":
        sections["routing"].update(PROFILED)
    with pytest.raises(ConfigError) as exc:
        create_app(make_config(spec, base, **sections), tokens=tokens)
    assert str(exc.value).startswith(f"config: {key}: {path}: ")
    assert "\n" not in str(exc.value)


# ---- a FIFO or a device: refused at once, never waited on (issue 50) -------------------

RELEASE_S = 3.0  # a test that blocks on a FIFO is let go then, and fails on its clock


@contextlib.contextmanager
def fifo_released_after(
    path: Path, content: bytes = b"", after_s: float = RELEASE_S
) -> Iterator[None]:
    """A FIFO at `path`; a reader that blocks on it is let go after `after_s` by a writer
    that comes with `content`, so a test of "never waits" fails on time, not by hanging."""
    os.mkfifo(path)
    done = threading.Event()

    def writer_comes() -> None:
        if done.wait(after_s):
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: no reader waits
        except OSError:
            return
        with contextlib.suppress(OSError):
            os.write(fd, content)
        os.close(fd)

    thread = threading.Thread(target=writer_comes, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@pytest.mark.parametrize("key", ["state_path", "profile_path"])
async def test_a_fifo_as_a_start_file_is_one_line_not_a_hang(
    gateway_for: GatewayFactory, tmp_path: Path, key: str
) -> None:
    """The read waited for a writer: the gateway never started."""
    path = tmp_path / "fifo"
    started = time.monotonic()
    with fifo_released_after(path, json.dumps(STATE).encode()), capture_logs() as logs:
        gateway = await gateway_for(routing={**PROFILED, key: str(path)})
        await _answers(gateway)
        await wait_until(
            lambda: bool(_unusable(logs, f"routing.{key}")),
            "the one line",
            timeout_s=2,
        )
    assert time.monotonic() - started < RELEASE_S / 2
    (line,) = _unusable(logs, f"routing.{key}")
    assert line["error"] == "is a FIFO, not a regular file"


@pytest.mark.parametrize("key", ["routing.model_path", "auth.api_keys_file"])
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "directory"])
def test_an_operators_file_that_is_not_a_file_is_a_config_error_at_once(
    config: Config, tokens: TokenCounter, tmp_path: Path, key: str, kind: str
) -> None:
    table, name = key.split(".")
    spec, base = config.backends.speculative.urls[0], config.backends.baseline.urls[0]
    path = {"fifo": str(tmp_path / "fifo"), "directory": str(tmp_path)}.get(kind, kind)
    sections: dict[str, dict[str, object]] = {table: {name: path}}
    if table == "routing":
        sections["routing"].update(PROFILED)
    started = time.monotonic()
    with (
        fifo_released_after(tmp_path / "fifo", b"a-key\n"),
        pytest.raises(ConfigError) as exc,
    ):
        create_app(make_config(spec, base, **sections), tokens=tokens)
    assert time.monotonic() - started < RELEASE_S / 2
    assert str(exc.value).startswith(f"config: {key}: {path}: is a ")
    assert str(exc.value).endswith(", not a regular file") and "\n" not in str(exc.value)
