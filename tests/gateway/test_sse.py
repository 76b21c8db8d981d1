"""gateway/wire/sse.py: events cut out of a backend's bytes however they are framed and split,
in time linear in the stream, with a bound on an event that never ends."""

from __future__ import annotations

import time

import pytest

from gateway.wire.sse import EventCutter, EventTooLong

STREAM = b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'


def cut(pieces: list[bytes], max_event_bytes: int = 1 << 20) -> list[bytes]:
    events = EventCutter(max_event_bytes)
    out = [events.feed(p) for p in pieces]
    return [o for o in out if o] + ([events.rest()] if events.pending else [])


@pytest.mark.parametrize("framing", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize("size", [1, 2, 3, 7, len(STREAM)])
def test_any_framing_split_anywhere_gives_the_same_events(framing: bytes, size: int) -> None:
    """SSE's three line ends, cut into pieces of every size (a CRLF or a blank line
    split across two reads included): the same LF-framed events, none early, none lost."""
    sent = STREAM.replace(b"\n", framing)
    pieces = [sent[i : i + size] for i in range(0, len(sent), size)]
    got = cut(pieces)
    assert b"".join(got) == STREAM
    assert all(run.endswith(b"\n\n") for run in got)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_mixed_line_ends_split_anywhere_give_the_same_events(size: int) -> None:
    """SSE lets each line end be LF, CRLF or CR. A CRLF's LF read alone spends its CR:
    an LF in the next read is a line end of its own (here, the blank line)."""
    sent = b"data: a\r\n\ndata: b\n\r\ndata: [DONE]\r\r"
    pieces = [sent[i : i + size] for i in range(0, len(sent), size)]
    got = cut(pieces)
    assert b"".join(got) == b"data: a\n\ndata: b\n\ndata: [DONE]\n\n"
    assert all(run.endswith(b"\n\n") for run in got)


def test_a_whole_chunk_of_whole_events_is_passed_on_without_a_copy() -> None:
    events = EventCutter(1 << 20)
    assert events.feed(STREAM) is STREAM  # vLLM's usual read: the hot path copies nothing
    assert not events.pending


def test_an_event_that_never_ends_is_bounded() -> None:
    events = EventCutter(1000)
    events.feed(b"data: " + b"x" * 900)
    with pytest.raises(EventTooLong):
        events.feed(b"x" * 200)


def test_the_cost_grows_with_the_size_not_its_square() -> None:
    """16 MB with no event end, read 4 KiB at a time. Concatenating and searching the
    whole buffer on each read cost 2 s of CPU for 8 MB (four times that for 16);
    copying each byte once costs milliseconds."""
    events = EventCutter(32 << 20)
    piece = b'data: {"choices": []}\n' * 186  # 4 KiB, line ends and no blank line
    started = time.process_time()
    for _ in range(4096):
        assert events.feed(piece) == b""
    assert time.process_time() - started < 1.0
