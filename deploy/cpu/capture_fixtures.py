"""Capture real vLLM responses and /metrics scrapes as test fixtures.

Talks to a running CPU pair (deploy/cpu/up.sh) and writes, byte for byte as
the servers sent them, into deploy/cpu/fixtures/ (or --out):

  requests.json                        the request bodies used below, by name
  chat_nonstream_speculative.json      non-stream chat answer, with metrics.speculative_decoding
  chat_nonstream_baseline.json         the same request on the baseline
  chat_stream_speculative.sse          stream, stream_options.include_usage
  chat_stream_continuous_speculative.sse  ... plus continuous_usage_stats
  chat_stream_continuous_baseline.sse  the same request on the baseline
  completion_nonstream_speculative.json  /v1/completions, non-stream
  completion_stream_speculative.sse    /v1/completions, stream + include_usage
  chat_json_schema_speculative.json    response_format json_schema
  models.json                          GET /v1/models
  errors.json                          {case: {status, content_type, body}} for bad requests
  metrics_speculative.txt              full /metrics scrape after all of the above
  metrics_baseline.txt                 idem

Standard library only:
  python deploy/cpu/capture_fixtures.py --speculative URL --baseline URL [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m"
COPY_PROMPT = (
    'Copy this JSON exactly: {"name": "Ada Lovelace", "born": 1815, '
    '"field": "mathematics", "known_for": "the first computer program"}'
)

REQUESTS: dict[str, dict[str, Any]] = {
    "chat_nonstream": {
        "model": MODEL,
        "messages": [{"role": "user", "content": COPY_PROMPT}],
        "max_tokens": 40,
        "temperature": 0,
    },
    "chat_stream": {
        "model": MODEL,
        "messages": [{"role": "user", "content": COPY_PROMPT}],
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
    "chat_stream_continuous": {
        "model": MODEL,
        "messages": [{"role": "user", "content": COPY_PROMPT}],
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    },
    "completion_nonstream": {
        "model": MODEL,
        "prompt": "one two three four one two three four one two",
        "max_tokens": 16,
        "temperature": 0,
    },
    "completion_stream": {
        "model": MODEL,
        "prompt": "one two three four one two three four one two",
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
    "chat_json_schema": {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "Give the name and birth year of Ada Lovelace as JSON."}
        ],
        "max_tokens": 40,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "person",
                "schema": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "born": {"type": "integer"}},
                    "required": ["name", "born"],
                    "additionalProperties": False,
                },
            },
        },
    },
}

ERRORS: dict[str, tuple[str, bytes]] = {
    "max_tokens_too_large": (
        "/v1/chat/completions",
        json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}
        ).encode(),
    ),
    "unknown_model": (
        "/v1/chat/completions",
        json.dumps(
            {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
        ).encode(),
    ),
    "missing_messages": ("/v1/chat/completions", json.dumps({"model": MODEL}).encode()),
    "invalid_json": ("/v1/chat/completions", b'{"model": '),
    "negative_temperature": (
        "/v1/chat/completions",
        json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": -1}
        ).encode(),
    ),
    "prompt_too_long": (
        "/v1/completions",
        json.dumps({"model": MODEL, "prompt": "word " * 3000, "max_tokens": 4}).encode(),
    ),
}


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers.get("content-type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speculative", required=True)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "fixtures")
    args = ap.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    urls = {"speculative": args.speculative.rstrip("/"), "baseline": args.baseline.rstrip("/")}

    (out / "requests.json").write_text(json.dumps(REQUESTS, indent=2) + "\n")

    def capture(name: str, route: str, path: str, ext: str) -> None:
        status, _, body = http("POST", urls[route] + path, json.dumps(REQUESTS[name]).encode())
        if status != 200:
            raise SystemExit(f"{name} on {route}: HTTP {status}: {body[:300]!r}")
        (out / f"{name}_{route}.{ext}").write_bytes(body)
        print(f"wrote {name}_{route}.{ext} ({len(body)} bytes)", file=sys.stderr)

    capture("chat_nonstream", "speculative", "/v1/chat/completions", "json")
    capture("chat_nonstream", "baseline", "/v1/chat/completions", "json")
    capture("chat_stream", "speculative", "/v1/chat/completions", "sse")
    capture("chat_stream_continuous", "speculative", "/v1/chat/completions", "sse")
    capture("chat_stream_continuous", "baseline", "/v1/chat/completions", "sse")
    capture("completion_nonstream", "speculative", "/v1/completions", "json")
    capture("completion_stream", "speculative", "/v1/completions", "sse")
    capture("chat_json_schema", "speculative", "/v1/chat/completions", "json")

    _, _, models = http("GET", urls["speculative"] + "/v1/models")
    (out / "models.json").write_bytes(models)

    errors: dict[str, Any] = {}
    for case, (path, body) in ERRORS.items():
        status, ctype, resp = http("POST", urls["baseline"] + path, body)
        errors[case] = {
            "path": path,
            "status": status,
            "content_type": ctype,
            "body": json.loads(resp),
        }
    (out / "errors.json").write_text(json.dumps(errors, indent=2) + "\n")

    for route, url in urls.items():
        _, _, text = http("GET", url + "/metrics")
        (out / f"metrics_{route}.txt").write_bytes(text)
        print(f"wrote metrics_{route}.txt ({len(text)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
