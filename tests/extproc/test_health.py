"""The picker's `grpc.health.v1.Health` service, over a real gRPC channel on an ephemeral
port: SERVING while a backend answers, NOT_SERVING when none does and from the first
moment of a drain; a draining picker refuses new ExternalProcessor streams (Envoy then
fails open) and lets the open ones finish."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from classifier.tokens import TokenCounter
from gateway.extproc.pb import ext_proc_subset_pb2 as pb
from gateway.extproc.server import SERVICE, Running, start
from tests.support import wait_until
from tooling.emulator import EmulatorConfig, SharedGpu, create_emulator_app
from tooling.local_stack import MODEL, gateway_config, serve_app

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
async def picker(tokens: TokenCounter) -> AsyncIterator[tuple[Running, list[web.AppRunner]]]:
    gpu = SharedGpu()
    spec_cfg = EmulatorConfig(mode="speculative", model=MODEL, time_scale=0.05)
    base_cfg = EmulatorConfig(mode="baseline", model=MODEL, time_scale=0.05)
    spec_runner, spec_url = await serve_app(create_emulator_app(spec_cfg, gpu))
    base_runner, base_url = await serve_app(create_emulator_app(base_cfg, gpu))
    runners = [spec_runner, base_runner]
    upstream = {"health_interval_s": 0.2, "health_timeout_s": 0.5, "scrape_interval_s": 0.5}
    config = gateway_config(spec_url, base_url, spec_cfg, upstream=upstream)
    running = await start(config, tokens=tokens)
    try:
        yield running, runners
    finally:
        await running.stop(grace_s=0)
        for runner in runners:
            await runner.cleanup()


@contextlib.asynccontextmanager
async def channel(running: Running) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as ch:
        yield ch


async def check(ch: grpc.aio.Channel, service: str = "") -> int:
    stub: Any = health_pb2_grpc.HealthStub(ch)  # the stubs' types are for the sync API
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(reply.status)


def _headers() -> pb.ProcessingRequest:
    headers = [(":method", "POST"), (":path", "/v1/chat/completions"),
               ("content-type", "application/json")]  # fmt: skip
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=pb.HeaderMap(
                headers=[pb.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers]
            )
        )
    )


def _process(ch: grpc.aio.Channel) -> grpc.aio.StreamStreamCall[Any, Any]:
    method = ch.stream_stream(
        f"/{SERVICE}/Process",
        request_serializer=pb.ProcessingRequest.SerializeToString,
        response_deserializer=pb.ProcessingResponse.FromString,
    )
    return method()


async def test_serving_for_the_server_and_the_ext_proc_service(
    picker: tuple[Running, list[web.AppRunner]],
) -> None:
    running, _ = picker
    async with channel(running) as ch:
        assert await check(ch) == SERVING
        assert await check(ch, SERVICE) == SERVING
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await check(ch, "no.such.Service")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


async def test_not_serving_once_no_backend_answers(
    picker: tuple[Running, list[web.AppRunner]],
) -> None:
    running, runners = picker
    async with channel(running) as ch:
        assert await check(ch, SERVICE) == SERVING
        for runner in runners:
            await runner.cleanup()
        runners.clear()

        async def down() -> bool:
            return await check(ch, SERVICE) == NOT_SERVING

        await wait_until(down, "NOT_SERVING after both backends died", timeout_s=5)
        assert await check(ch) == NOT_SERVING


async def test_draining_is_not_serving_refuses_new_streams_and_waits_for_open_ones(
    picker: tuple[Running, list[web.AppRunner]],
) -> None:
    running, _ = picker
    async with channel(running) as ch:
        stub: Any = health_pb2_grpc.HealthStub(ch)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=SERVICE))
        assert (await watch.read()).status == SERVING
        open_stream = _process(ch)
        await open_stream.write(_headers())
        await open_stream.read()  # the headers answered: the stream is open
        assert running.picker.streams == 1

        drained = asyncio.create_task(running.drain(drain_s=10))
        assert (await asyncio.wait_for(watch.read(), 5)).status == NOT_SERVING
        assert await check(ch) == NOT_SERVING
        assert await check(ch, SERVICE) == NOT_SERVING
        refused = _process(ch)
        await refused.write(_headers())
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await refused.read()
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        await asyncio.sleep(0.2)
        assert not drained.done()  # the open stream still has its time

        await open_stream.done_writing()  # Envoy ends the stream: the request is over
        assert await asyncio.wait_for(drained, 5) == 0
        assert running.picker.streams == 0
        watch.cancel()


async def test_a_drain_that_runs_out_of_time_says_how_many_are_left(
    picker: tuple[Running, list[web.AppRunner]],
) -> None:
    running, _ = picker
    async with channel(running) as ch:
        open_stream = _process(ch)
        await open_stream.write(_headers())
        await open_stream.read()
        assert await running.drain(drain_s=0.2) == 1
        open_stream.cancel()
        await wait_until(lambda: running.picker.streams == 0, "the stream closed", timeout_s=5)
