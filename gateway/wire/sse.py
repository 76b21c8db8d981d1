"""Cut a backend's SSE bytes into runs of whole events: in linear time, in bounded space.

An event ends with a blank line. vLLM frames with LF (`data: ...\\n\\n`); SSE also
allows CRLF and CR line ends, which are turned into LF here, so that the event
readers and the client see one framing. JSON escapes every control character, so a
raw CR never belongs to an event's data: it is always framing.

Each byte is copied once into the buffer and once out of it, and only the new bytes
are searched for the end of an event, so the cost grows with the size of the stream,
not its square; and an event that grows past `max_event_bytes` without ending is the
backend's failure, not a reason to keep buffering.
"""

from __future__ import annotations

_LF = b"\n"
_EVENT_END = b"\n\n"


class EventTooLong(Exception):
    """The backend sent more than the bound without ending an event."""


class EventCutter:
    def __init__(self, max_event_bytes: int) -> None:
        self._max = max_event_bytes
        self._parts: list[bytes] = []  # the event begun and not ended yet
        self._size = 0
        self._cr = False  # the last bytes ended with a CR, turned into an LF already

    def feed(self, data: bytes) -> bytes:
        """The events that `data` completes (b"" if none), LF-framed, ends included."""
        if self._cr or b"\r" in data:
            data = self._lf(data)
        end = data.rfind(_EVENT_END) + 2  # 1: not in data
        if end == 1 and not (data[:1] == _LF and self._parts and self._parts[-1][-1:] == _LF):
            end = 0  # nor across the last bytes and these
        if end == 0:
            self._keep(data)
            return b""
        complete = b"".join((*self._parts, data[:end])) if self._parts else data[:end]
        self._parts, self._size = [], 0
        self._keep(data[end:])
        return complete

    @property
    def pending(self) -> bool:
        """An event has begun and not ended."""
        return bool(self._parts)

    def rest(self) -> bytes:
        """What came after the last complete event."""
        return b"".join(self._parts)

    def _keep(self, data: bytes) -> None:
        if not data:
            return
        self._parts.append(data)
        self._size += len(data)
        if self._size > self._max:
            raise EventTooLong(f"an event over {self._max} bytes")

    def _lf(self, data: bytes) -> bytes:
        if self._cr and data[:1] == _LF:
            data = data[1:]  # the LF of a CRLF cut in two: its CR became an LF already
            self._cr = False  # that CR is spent: a next read's LF is a line end of its own
        if data:
            self._cr = data[-1:] == b"\r"
        return data.replace(b"\r\n", _LF).replace(b"\r", _LF)
