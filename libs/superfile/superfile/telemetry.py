"""Metrics for the services: OpenTelemetry instruments exported in Prometheus text format.

Every service process calls :func:`meter` for its instruments and serves
:func:`render` at ``/metrics``. Importing this module needs the ``service``
extra (opentelemetry-sdk, opentelemetry-exporter-prometheus).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Histogram, Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

__all__ = ["CONTENT_TYPE", "meter", "render", "seconds_histogram", "serve", "setup"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_lock = threading.Lock()
_provider: MeterProvider | None = None
# Latency buckets from 0.5 ms to 30 s: queries sit at the low end, commits and publish-to-visible at the high end.
_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def setup(service_name: str) -> MeterProvider:
    """Install the process-wide meter provider once (later calls return the first one)."""
    global _provider
    with _lock:
        if _provider is None:
            _provider = MeterProvider(
                metric_readers=[PrometheusMetricReader()],
                resource=Resource.create({"service.name": service_name}),
            )
            metrics.set_meter_provider(_provider)
        return _provider


def meter(name: str) -> Meter:
    """A meter for one component (e.g. ``superfile.gateway``); sets up the provider if needed."""
    return setup(name.split(".")[-1] if "." in name else name).get_meter(name)


def render() -> bytes:
    """The current metrics in the Prometheus text exposition format."""
    return generate_latest(REGISTRY)


def seconds_histogram(m: Meter, name: str, description: str) -> Histogram:
    """A latency histogram in seconds with buckets that resolve milliseconds (the default ones do not)."""
    return m.create_histogram(name, unit="s", description=description, explicit_bucket_boundaries_advisory=_SECONDS)


class _MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        body = render()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return  # scrapes are not worth a log line


def serve(port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve ``/metrics`` on a daemon thread, for processes without a web app of their own (the builder,
    the ingest job); ``shutdown()`` the returned server to stop."""
    server = ThreadingHTTPServer((host, port), _MetricsHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
