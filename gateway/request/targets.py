"""A request's latency targets, and how each answer met them.

Read from llm-d's per-request SLO headers (its EPP's names; the older `x-slo-*` still
read as aliases, as llm-d does), each one replacing its model's configured default
(`[latency_targets.MODEL]`, "*" for any model). The pick they make is the policy's
(classifier/targets.py); the answer says whether its route was predicted to meet them
(request/dispatch.py SLO_HEADER), and `specroute_slo_requests_total` counts whether it did
(RequestRecord.slo, gateway/outcomes/accounting.py).

A whole (non-streamed) answer arrives at once: the gateway sees no first token, so
neither its TTFT nor its TPOT is measured, and it counts as `unmeasured`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from classifier.features import RequestFeatures
from classifier.targets import LatencyTargets
from classifier.types import Decision
from gateway.config import MAX_TARGET_MS, Config
from gateway.errors import APIError

# llm-d's names first; an alias is read only where its llm-d name is absent.
TTFT_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
TPOT_HEADERS = ("x-llm-d-slo-tpot-ms", "x-slo-tpot-ms")
# SLO_HEADER (request/dispatch.py), the answer's: "met" (its route was predicted to meet
# every target), "unmet" (no route was; the closest answered), "unknown" (no prediction
# chose it: a forced route, a stored response, a policy without one).
ANY_MODEL = "*"
# Milliseconds as plain decimals: no sign, exponent, NaN or infinity.
_MS = re.compile(r"[0-9]{1,7}(?:\.[0-9]{1,6})?")
# 0 asks for the first token as soon as possible (llm-d's batch gateway sends 0 once a
# job's deadline has passed): the smallest target, which only the fastest route nears.
_ASAP_MS = 0.001


def read_targets(
    headers: Mapping[str, str], body: Mapping[str, Any], config: Config
) -> LatencyTargets | None:
    """The request's targets (None: none asked, none configured); a header that is no
    number of ms in [0, MAX_TARGET_MS] is the client's error, 400 naming it."""
    model = body.get("model")
    targets = config.latency_targets
    default = (targets.get(model) if isinstance(model, str) else None) or targets.get(ANY_MODEL)
    ttft = _header_ms(headers, TTFT_HEADERS)
    tpot = _header_ms(headers, TPOT_HEADERS)
    if ttft is None and default is not None:
        ttft = default.ttft_ms
    if tpot is None and default is not None:
        tpot = default.tpot_ms
    if ttft is None and tpot is None:
        return None
    return LatencyTargets(
        ttft_s=None if ttft is None else ttft / 1000.0,
        tpot_s=None if tpot is None else tpot / 1000.0,
    )


def _header_ms(headers: Mapping[str, str], names: tuple[str, ...]) -> float | None:
    for name in names:
        raw = headers.get(name)
        if raw is None:
            continue
        text = raw.strip()
        value = float(text) if _MS.fullmatch(text) else -1.0
        if not 0.0 <= value <= MAX_TARGET_MS:
            shown = text if len(text) <= 40 else text[:40] + "..."
            raise APIError(
                400,
                f"{name} must be a number of milliseconds from 0 to {MAX_TARGET_MS:.0f}"
                f" (digits, an optional decimal point), got {shown!r}",
                param=name,
            )
        return value or _ASAP_MS
    return None


def with_targets(
    features: RequestFeatures, headers: Mapping[str, str], body: Mapping[str, Any], config: Config
) -> RequestFeatures:
    """The features with the request's targets, for the policy to read."""
    targets = read_targets(headers, body, config)
    return features if targets is None else dataclasses.replace(features, targets=targets)


def predicted_header(features: RequestFeatures, decision: Decision) -> str | None:
    """SLO_HEADER's value (met, unmet, unknown): None where the request has no target."""
    if features.targets is None:
        return None
    judged = (decision.why or {}).get("targets")
    met = judged.get("met") if isinstance(judged, Mapping) else None
    if not isinstance(met, bool):
        return "unknown"
    return "met" if met else "unmet"
