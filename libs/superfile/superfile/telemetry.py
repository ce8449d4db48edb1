"""Metrics for the services: Prometheus instruments from the Prometheus client library, served at ``/metrics``.

Each service's metrics are module-level instruments of the module that records them, in the process's default
registry, so they exist as soon as the service is imported: a scrape of a process that has served nothing lists
every metric. An instrument without labels starts at zero; one with labels whose values are known beforehand
(a query kind, a refusal's reason) starts with a zero series for each (:func:`preset`); one whose label values
come from traffic (a table, an error type) is listed with its HELP and TYPE lines and no series until the
first. Values read when scraped (a cache's size, the queries running now) are :class:`Observed` collectors.

The web services answer ``GET /metrics`` with :func:`render`; the processes without a web app of their own
(the builder, the ingest job) :func:`serve` it with the library's own HTTP server. Importing this module turns
off the library's ``<name>_created`` series in the process; ``import superfile`` does not import it (the query
root's fan-out makes its metrics with its first ``Fleet``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from http.server import HTTPServer
from typing import Literal

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Histogram,
    disable_created_metrics,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "Observed", "preset", "render", "seconds_histogram", "serve"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Latency buckets from 0.5 ms to 30 s: queries sit at the low end, commits and publish-to-visible at the high end.
_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# No ``<name>_created`` series beside every counter and histogram: nothing reads them, and each doubles a family.
disable_created_metrics()


def seconds_histogram(name: str, documentation: str, labelnames: Sequence[str] = ()) -> Histogram:
    """A latency histogram in seconds (``name`` ends in ``_seconds``) with buckets that resolve milliseconds
    (the library's default ones start at 5 ms)."""
    return Histogram(name, documentation, labelnames, buckets=_SECONDS)


def preset(metric: MetricWrapperBase, **values: Iterable[str]) -> None:
    """Create the zero series of ``metric`` for every combination of the label values given (every label of
    the metric named), so they are scraped before the first event."""
    names = list(values)
    for combination in itertools.product(*(list(v) for v in values.values())):
        metric.labels(**dict(zip(names, combination, strict=True)))


class Observed(Collector):
    """A gauge or counter whose values are read when scraped: ``read()`` returns the value of each series by its
    label values (in ``labelnames`` order; ``()`` without labels). Registered on creation; listed, with no
    series, while ``read()`` returns none."""

    def __init__(
        self,
        name: str,
        documentation: str,
        read: Callable[[], Mapping[tuple[str, ...], float]],
        *,
        labelnames: Sequence[str] = (),
        kind: Literal["gauge", "counter"] = "gauge",
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self.kind = kind
        self._read = read
        REGISTRY.register(self)

    def _family(self) -> GaugeMetricFamily | CounterMetricFamily:
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for labels, value in self._read().items():
            family.add_metric(list(labels), value)
        yield family


def render() -> bytes:
    """The current metrics in the Prometheus text exposition format (``CONTENT_TYPE``)."""
    return generate_latest(REGISTRY)


def serve(port: int, host: str = "0.0.0.0") -> HTTPServer:
    """Serve the metrics (``/metrics``; the library's server answers them on any path) on a daemon thread, for
    processes without a web app of their own (the builder, the ingest job); ``shutdown()`` it to stop."""
    server, _thread = start_http_server(port, host)
    return server
