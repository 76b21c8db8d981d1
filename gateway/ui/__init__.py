"""GET /ui: the side-by-side page. Static HTML, CSS and a script, shipped in the package.

One prompt on both routes, streamed next to each other, with the gateway's
dry-run decision above them (gateway/api/decide.py) and its live figures beside
them (gateway/api/stats.py). No build step, no framework, no CDN: the three
files are read once at import and served from memory, under a
Content-Security-Policy that lets the page load and call nothing but this
gateway, so it works offline.

The files hold no data and no configuration, so with [auth] on they are served
without a key (a browser sends none on a page load, gateway/auth.py lets these
paths through): the page asks for the key, keeps it in a script variable only
(no storage, no cookie) and sends it with every call. `[ui] enabled = false`
turns the page off (404); it is read per request, so a reload applies it.

Two things the page asks besides /stats and /decide: each route's vLLM /version
(through the gateway, x-specroute-route), where an emulated server says so and names
the GPU profile its timing models, so that the page says EMULATED on every panel; and
its own runs carry x-specroute-client: ui, so the gateway counts their decisions under
reason "ui", not as clients' "override" (gateway/request/pipeline.py).
"""

from __future__ import annotations

import importlib.resources

from aiohttp import web

from gateway.state import RUNTIME

PATH = "/ui"
_TYPES = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}
_STATIC = importlib.resources.files("gateway.ui").joinpath("static")
_FILES = {name: _STATIC.joinpath(name).read_bytes() for name in _TYPES}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


async def page(request: web.Request) -> web.Response:
    """/ui is index.html; /ui/app.js and /ui/style.css its two other files."""
    if not request.app[RUNTIME].current.config.ui.enabled:
        raise web.HTTPNotFound()
    name = request.match_info.get("name", "index.html")
    body = _FILES.get(name)
    if body is None:
        raise web.HTTPNotFound()
    return web.Response(body=body, content_type=_TYPES[name], charset="utf-8", headers=_HEADERS)
