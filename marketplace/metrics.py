"""Prometheus metrics at /metrics (R15).

Two sources, each exact whatever the number of processes:
- Domain state is computed from the database at scrape time (drains, cuts,
  workers, slots, rentals reclaimed, notices): every process reports the same
  totals, so scraping any one of them, or several, gives the right figures.
- Per-request figures (router outcomes and latencies, heartbeats) are counted in
  process with prometheus_client; with PROMETHEUS_MULTIPROC_DIR set (the
  Procfile sets it), every process on a machine reports the machine's sum.
"""

import os
from collections.abc import Iterable

from django.conf import settings
from datetime import timedelta

from django.db.models import Count, DurationField, F, Q, QuerySet, Sum, Value
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
DRAIN_BUCKETS = (1, 5, 10, 20, 30, 60, 90, 120, 150, 300)

ROUTER_REQUESTS = Counter("router_requests_total", "Router requests by outcome.", ["outcome"])
ROUTER_ADDED_LATENCY = Histogram(
    "router_added_latency_seconds",
    "Time the router adds before the worker's first byte (admission, body rewrite, connect).",
    buckets=LATENCY_BUCKETS,
)
HEARTBEATS = Counter("agent_heartbeats_total", "Agent heartbeats received.")
HEARTBEATS_LATE = Counter(
    "agent_heartbeats_late_total", "Heartbeats that came more than two intervals after the node's previous one."
)


class DomainCollector:
    """Figures read from the database at scrape time."""

    def collect(self) -> Iterable:
        from nodes.models import Reclaim, Slot, Worker, WorkerStatus
        from rentals.models import EndReason, Rental

        started = CounterMetricFamily("drains_started", "Drains started, by trigger.", labels=["trigger"])
        for row in Reclaim.objects.values("trigger").annotate(n=Count("id")):
            started.add_metric([row["trigger"]], row["n"])
        yield started

        finished = CounterMetricFamily(
            "drains_finished", "Drains finished, by trigger and outcome (clean: nothing cut).", labels=["trigger", "outcome"]
        )
        done = Reclaim.objects.filter(finished_at__isnull=False)
        for row in done.values("trigger").annotate(n=Count("id"), cut=Count("id", filter=Q(cut__gt=0))):
            finished.add_metric([row["trigger"], "clean"], row["n"] - row["cut"])
            finished.add_metric([row["trigger"], "cut"], row["cut"])
        yield finished

        yield _drain_duration_histogram(done)

        cut = CounterMetricFamily("requests_cut", "Requests still running when a drain's deadline stopped their worker.")
        cut.add_metric([], Worker.objects.aggregate(n=Sum("requests_cut"))["n"] or 0)
        yield cut

        workers = GaugeMetricFamily("workers", "Workers by status.", labels=["status"])
        counts = dict(Worker.objects.values_list("status").annotate(n=Count("id")))
        for status in WorkerStatus.values:
            workers.add_metric([status], counts.get(status, 0))
        yield workers

        slots = GaugeMetricFamily("slots_in_use", "Router requests in flight (slot leases held).")
        slots.add_metric([], Slot.objects.count())
        yield slots

        reclaimed = CounterMetricFamily("rentals_reclaimed", "Rentals ended by a spot reclaim.")
        reclaimed.add_metric([], Rental.objects.filter(end_reason=EndReason.SPOT_RECLAIM).count())
        yield reclaimed

        yield from _notice_families()


def _drain_duration_histogram(done: QuerySet) -> HistogramMetricFamily:
    """Bucket counts in one aggregate query; the sum from the durations themselves."""
    at_most = {
        f"le_{i}": Count("id", filter=Q(finished_at__lte=F("started_at") + Value(timedelta(seconds=b), DurationField())))
        for i, b in enumerate(DRAIN_BUCKETS)
    }
    row = done.aggregate(total=Count("id"), **at_most)
    total_s = sum((end - start).total_seconds() for start, end in done.values_list("started_at", "finished_at").iterator())
    histogram = HistogramMetricFamily("drain_duration_seconds", "From a drain's start to its finish.")
    buckets = [(str(b), row[f"le_{i}"]) for i, b in enumerate(DRAIN_BUCKETS)] + [("+Inf", row["total"])]
    histogram.add_metric([], buckets=buckets, sum_value=total_s)
    return histogram


def _notice_families() -> Iterable:
    try:
        from preemption.metrics import samples
    except ImportError:
        return
    family = CounterMetricFamily("preemption_notices", "Cloud notices by source, kind, mode and action.", labels=["source", "kind", "mode", "action"])
    for _name, labels, value in samples():
        family.add_metric([labels.get(k, "") for k in ("source", "kind", "mode", "action")], value)
    yield family


def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(reg)
    else:
        from prometheus_client import REGISTRY

        for collector in (ROUTER_REQUESTS, ROUTER_ADDED_LATENCY, HEARTBEATS, HEARTBEATS_LATE):
            reg.register(_Forward(collector))
    reg.register(DomainCollector())
    return reg


class _Forward:
    """Expose one collector of the default registry in ours (single-process mode)."""

    def __init__(self, collector):
        self.collector = collector

    def collect(self):
        return self.collector.collect()


def metrics_view(request: HttpRequest) -> HttpResponse:
    token = settings.METRICS_TOKEN
    if token and request.headers.get("Authorization", "") != f"Bearer {token}":
        return HttpResponse("metrics need the bearer token\n", status=401, content_type="text/plain")
    return HttpResponse(generate_latest(registry()), content_type="text/plain; version=0.0.4; charset=utf-8")
