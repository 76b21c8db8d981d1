"""Names checked by a regex are matched whole: `$` also matches before a trailing newline."""

from __future__ import annotations

from gateway.errors import request_id_of


def test_a_request_id_with_a_trailing_newline_is_replaced() -> None:
    """It is echoed in a response header, where a newline would fail the answer."""
    assert request_id_of({"X-Request-Id": "abc-1"}) == "abc-1"
    fresh = request_id_of({"X-Request-Id": "abc-1\n"})
    assert fresh != "abc-1\n" and len(fresh) == 32
