"""What /metrics exposes besides the request metrics: no `_created` series, the
process, platform and GC collectors, `specroute_build_info`; per-URL health and
ejections with the URL in the log lines; `route` as the one label of a route;
0..1 quantities named `_ratio`; the ext-proc stream counter only in ext-proc."""

from __future__ import annotations

import importlib.metadata
import platform

import pytest
from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from classifier.types import Route
from gateway.app import create_app
from gateway.backends.pool import BackendPool, url_label
from gateway.config import Config, parse_config
from gateway.extproc.stream import Mode
from gateway.state import METRICS
from gateway.telemetry import ExtProcMetrics, Metrics
from tests.gateway.test_observability import samples

URLS = {
    "speculative": ["http://user:secret@127.0.0.1:9"],
    "baseline": ["http://127.0.0.1:10", "http://127.0.0.1:11"],
}


def config() -> Config:
    return parse_config({"backends": {r: {"urls": u} for r, u in URLS.items()}})


def scrape(metrics: Metrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_no_created_series_and_the_process_platform_and_build_info() -> None:
    metrics = Metrics()
    metrics.requests.labels("speculative", "chat", "2xx").inc()
    metrics.duration.labels("speculative", "chat").observe(0.3)
    text = scrape(metrics)
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert "specroute_requests_total" in names  # the counter is there...
    assert "specroute_request_duration_seconds_count" in names
    assert not [n for n in names if n.endswith("_created")], text  # ...without _created
    assert "_created" not in text
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names
    assert {"python_info", "python_gc_collections_total"} <= names
    try:
        version = importlib.metadata.version("specroute")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    m = samples(text)
    labels = (("python", platform.python_version()), ("version", version))
    assert m[("specroute_build_info", labels)] == 1


def test_the_emulated_vllm_keeps_its_created_series() -> None:
    """The gateway's registry drops `_created` without the process-wide switch:
    vLLM's (and the emulator's) restart detection reads them."""
    from prometheus_client import CollectorRegistry, Counter

    Metrics()
    other = CollectorRegistry()
    Counter("vllm:spec_decode_num_draft_tokens", "d", registry=other).inc()
    assert "vllm:spec_decode_num_draft_tokens_created" in generate_latest(other).decode()


def test_endpoints_up_ejected_and_readmitted_by_url() -> None:
    metrics = Metrics()
    pool = BackendPool(
        config().routes, config().backends.pairs, metrics, eject_after_failures=2, eject_s=60
    )
    base = pool.of(Route.BASELINE)
    first, second = base.upstreams
    m = samples(scrape(metrics))
    for route, urls in URLS.items():
        for url in urls:
            key = (("route", route), ("url", url_label(url)))
            assert m[("specroute_endpoint_up", key)] == 1
            assert m[("specroute_endpoint_ejections_total", key)] == 0
    # No credentials in a label.
    assert url_label(URLS["speculative"][0]) == "http://127.0.0.1:9"
    assert "secret" not in scrape(metrics)

    with capture_logs() as logs:
        pool.report_failure(base, first, "http_5xx")
        pool.report_failure(base, first, "http_5xx")  # the second in a row: ejected
    m = samples(scrape(metrics))
    one = (("route", "baseline"), ("url", first.url))
    other = (("route", "baseline"), ("url", second.url))
    assert m[("specroute_endpoint_up", one)] == 0
    assert m[("specroute_endpoint_up", other)] == 1
    assert m[("specroute_endpoint_ejections_total", one)] == 1
    assert m[("specroute_endpoint_ejections_total", other)] == 0
    assert m[("specroute_backend_up", (("route", "baseline"),))] == 1  # the route still answers
    [ejected] = [e for e in logs if e["event"] == "backend_ejected"]
    assert (ejected["route"], ejected["url"]) == ("baseline", first.url)

    # Every other endpoint refuses: the ejected one, still reachable, comes back.
    with capture_logs() as logs:
        pool.report_refused(base, second, "connect")
        spec = pool.of(Route.SPECULATIVE)
        pool.report_refused(spec, spec.upstreams[0], "connect")
    m = samples(scrape(metrics))
    assert m[("specroute_endpoint_up", one)] == 1
    assert m[("specroute_endpoint_up", other)] == 0
    assert (
        m[("specroute_endpoint_up", (("route", "speculative"), ("url", "http://127.0.0.1:9")))] == 0
    )
    assert m[("specroute_backend_up", (("route", "speculative"),))] == 0
    events = {(e["event"], e["route"], e["url"]) for e in logs}
    assert ("backend_refused", "baseline", second.url) in events
    assert ("backend_refused", "speculative", "http://127.0.0.1:9") in events
    assert ("backend_readmitted", "baseline", first.url) in events


def test_one_label_for_a_route_and_ratio_names() -> None:
    metrics = Metrics()
    defined = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(defined) > 30
    for m in defined:
        labels = set(m._labelnames)
        assert not {n for n in labels if "backend" in n}, (m._name, labels)
        # "rate" is per second in Prometheus; a share or a fraction is a ratio.
        assert not m._name.endswith(("_rate", "_usage", "_perc", "_percent")), m._name
    ratios = {
        metrics.acceptance,
        metrics.estimated_acceptance,
        metrics.backend_kv_usage,
        metrics.backend_acceptance,
        metrics.attributed_acceptance,
        metrics.prediction_ratio,
        metrics.profile_beside,
    }
    assert all(m._name.endswith("_ratio") for m in ratios)
    names = {m._name for m in defined}
    assert {
        "specroute_endpoint_up",
        "specroute_endpoint_ejections",
        "specroute_build_info",
    } <= names


@pytest.mark.parametrize("forward", [True, False])
def test_the_extproc_stream_counter_is_exported_by_ext_proc_only(forward: bool) -> None:
    app = create_app(config(), forward=forward)
    assert "specroute_extproc_streams" not in scrape(app[METRICS])
    if forward:
        return
    from gateway.extproc.server import Picker

    Picker(app, Mode.POOL)  # `specroute ext-proc` builds one per app
    m = samples(scrape(app[METRICS]))
    for end in ExtProcMetrics.ENDS:
        assert m[("specroute_extproc_streams_total", (("end", end),))] == 0
