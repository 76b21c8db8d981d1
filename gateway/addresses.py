"""Hosts, ports and backend URLs, as config.toml, the flags and the environment give them.

Each kind of value is one regular expression: the checker matches it whole
(`re.fullmatch`), and the JSON Schema states the same text as its pattern, so an editor
refuses what `specroute config --check` refuses. The expressions keep to the syntax
Python's re and ECMA-262 (JSON Schema's dialect) read alike, and the schema ends them
with `(?![\\s\\S])`, not `$`: in Python `$` also matches before a trailing newline, and
a route named "spec\\n" once passed that way and broke every response header.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = "[0-9A-Fa-f]{1,4}"


def _ipv6() -> str:
    """Eight groups, or fewer around one "::" (no embedded IPv4, no zone)."""
    forms = [f"(?:{_H16}:){{7}}{_H16}"]
    for before in range(8):
        head = {0: "", 1: _H16}.get(before, f"(?:{_H16}:){{{before - 1}}}{_H16}")
        after = 7 - before  # "::" stands for one group at least
        tail = f"(?:{_H16}(?::{_H16}){{0,{after - 1}}})?" if after else ""
        forms.append(f"{head}::{tail}")
    return f"(?:{'|'.join(forms)})"


IPV6 = _ipv6()
# Labels of letters, digits, "-" and "_" (compose service names), the last not all
# digits: "999.1.1.1" is a bad address, not a name to look up.
_LABEL = "[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
HOSTNAME = rf"(?:{_LABEL}\.)*(?=[0-9]*[A-Za-z_-]){_LABEL}"
HOST = f"(?:{HOSTNAME}|{IPV4}|{IPV6})"
PORT = "(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
_PCT = "%[0-9A-Fa-f]{2}"
_SUB = "A-Za-z0-9._~!$&'()*+,;="
_URL_HOST = rf"(?:{HOSTNAME}|{IPV4}|\[{IPV6}\])"
# A base URL: the gateway appends /v1/..., /health, /metrics to it, so no ?query or
# #fragment; a path prefix (a proxy's) may stay. user:password@ is sent as basic auth.
BASE_URL = (
    rf"[Hh][Tt][Tt][Pp][Ss]?://(?:(?:[{_SUB}:-]|{_PCT})*@)?{_URL_HOST}(?::{PORT})?"
    rf"(?:/(?:[{_SUB}:@-]|{_PCT})*)*"
)


def schema_pattern(regex: str) -> str:
    """`regex` anchored at both ends for a JSON Schema `pattern`, in either dialect."""
    return f"^(?:{regex})(?![\\s\\S])"


def parse_port(text: str) -> int | None:
    """A port from a flag or a variable, or None: 1-65535 in ASCII digits (int() also
    takes full-width ones)."""
    return int(text) if re.fullmatch(PORT, text) else None


def is_host(text: str) -> bool:
    """An address to listen on: a host name or an IP address."""
    return re.fullmatch(HOST, text) is not None


def url_problem(url: str) -> str | None:
    """What is wrong with a backend's base URL, in the operator's words; None: nothing."""
    if re.fullmatch(BASE_URL, url):
        return None
    if not url.isprintable() or " " in url:
        return "has a space or a control character"
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed [
        return "has no valid host name or IP address"
    if parts.scheme not in ("http", "https"):
        return "is not an http(s) URL"
    if parts.query or parts.fragment or "?" in url or "#" in url:
        return "has a ?query or #fragment: want the server's base URL, http://host:port"
    host_port = parts.netloc.rpartition("@")[2]
    host, port = host_port, None
    if ":" in host_port and not host_port.endswith("]"):
        host, _, port = host_port.rpartition(":")
    if port is not None and not re.fullmatch(PORT, port):
        return "has a bad port: want 1-65535 in ASCII digits"
    if not re.fullmatch(_URL_HOST, host):
        return "has no valid host name or IP address"
    return "is not a base URL: http(s)://host[:port][/path]"


def base_url(url: str) -> str:
    """A URL url_problem passed, without a trailing / or /v1: what paths are appended to."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


def server_key(url: str) -> tuple[str, str, int, str]:
    """What tells two base URLs' servers apart: scheme, host, port, path; not the
    credentials, nor the host's case."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port, parts.path


def redact_url(url: str) -> str:
    """`url` without its user:password@, for a log line, a label or the start banner."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
