"""Optional gateway API keys, compared in constant time.

Keys come from the environment or a file, never from config.toml (which lives
in git). The client's Authorization header is never forwarded: the backends
get their own keys (backends.<route>.api_key_env).

The keys apply to every path but /health, /ready and the page's static files.
/metrics takes them too, unless a metrics token is set: then that token, and
only it, opens /metrics (a scraper's credential opens nothing else).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from gateway.config import AuthConfig, ConfigError
from gateway.errors import error_response
from gateway.files import read_file

_OPEN_PATHS = ("/health", "/ready")
# The side-by-side page's static files (gateway/ui): no data in them, and a browser
# sends no key on a page load. The page asks for the key and sends it on every call.
_OPEN_PREFIX = "/ui"


@dataclass(frozen=True, slots=True)
class Keys:
    api_keys: tuple[bytes, ...] = ()
    metrics_token: bytes | None = None


def load_keys(config: AuthConfig) -> Keys:
    keys: list[str] = []
    if config.api_keys_env:
        keys += os.environ.get(config.api_keys_env, "").split(",")
    if config.api_keys_file:
        keys += read_file("auth.api_keys_file", config.api_keys_file, _lines)
    cleaned = tuple(k.strip().encode() for k in keys if k.strip())
    if (config.api_keys_env or config.api_keys_file) and not cleaned:
        raise ConfigError("config: auth names a key source but it holds no key")
    token = os.environ.get(config.metrics_token_env, "") if config.metrics_token_env else ""
    if config.metrics_token_env and not token:
        raise ConfigError(f"config: auth.metrics_token_env: ${config.metrics_token_env} is empty")
    return Keys(cleaned, token.encode() or None)


def _lines(data: bytes) -> list[str]:
    return data.decode().splitlines()


def matches(given: bytes, keys: tuple[bytes, ...]) -> bool:
    """Compare against every key, always: the time taken says nothing about which matched."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key)
    return found


def bearer(request: web.Request) -> bytes:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip().encode() if scheme.lower() == "bearer" else b""


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def auth_middleware(
    current_keys: Callable[[web.Request], Keys],
) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        keys = current_keys(request)
        if request.path in _OPEN_PATHS or _is_page(request.path):
            return await handler(request)
        if request.path == "/metrics" and keys.metrics_token is not None:
            if not matches(bearer(request), (keys.metrics_token,)):
                return _unauthorized("a valid metrics token is required")
            return await handler(request)
        if keys.api_keys and not matches(bearer(request), keys.api_keys):
            return _unauthorized("invalid or missing API key")
        return await handler(request)

    return middleware


def _is_page(path: str) -> bool:
    return path == _OPEN_PREFIX or path.startswith(_OPEN_PREFIX + "/")


def _unauthorized(message: str) -> web.Response:
    return error_response(
        401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
    )
