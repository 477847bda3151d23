"""Read side of nodes: lists with derived state in a constant number of queries."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import BooleanField, ExpressionWrapper, Prefetch, QuerySet
from django.utils import timezone

from nodes.models import LIVE_WORKER_STATUSES, Node, NodeState, Worker, WorkerStatus


def with_state(queryset: QuerySet[Node]) -> QuerySet[Node]:
    """Annotate `rented` and prefetch live workers, what `node_state` needs."""
    from rentals.selectors import rented_q

    live = Worker.objects.filter(status__in=LIVE_WORKER_STATUSES).select_related("model").order_by("created_at")
    return queryset.annotate(rented=ExpressionWrapper(rented_q(), output_field=BooleanField())).prefetch_related(
        Prefetch("workers", queryset=live, to_attr="live_workers")
    )


def node_state(node: Node, now: datetime | None = None) -> str:
    """draining, then paused, rented, offline, available: the first that holds."""
    now = now or timezone.now()
    if any(w.status == WorkerStatus.DRAINING for w in node.live_workers):
        return NodeState.DRAINING
    if not node.workload_enabled:
        return NodeState.PAUSED
    if node.rented:
        return NodeState.RENTED
    if not node.is_online(now):
        return NodeState.OFFLINE
    return NodeState.AVAILABLE


def provider_nodes(*, provider) -> QuerySet[Node]:
    return with_state(Node.objects.filter(provider=provider)).order_by("id")


def offers(*, viewer=None, now: datetime | None = None) -> QuerySet[Node]:
    """Rentable nodes: enabled, online, not rented, their provider listed (R11); a
    provider does not see their own. Each carries `reliability` (its score, or None)."""
    from rentals.selectors import rented_q
    from reputation.selectors import delisted_provider_ids, node_reliability_subquery

    now = now or timezone.now()
    queryset = (
        Node.objects.filter(workload_enabled=True, last_seen_at__gte=now - timedelta(seconds=settings.NODE_OFFLINE_S))
        .exclude(rented_q())
        .exclude(provider_id__in=delisted_provider_ids())
        .annotate(reliability=node_reliability_subquery())
    )
    if viewer is not None and viewer.is_authenticated:
        queryset = queryset.exclude(provider=viewer)
    return queryset.order_by("price_per_hour", "id")


# --- Portal (dashboard) read side ----------------------------------------------
#
# The pages show what the services did; nothing here changes a row. Every list
# helper keeps the page's query count independent of the number of nodes.

import hashlib  # noqa: E402
from dataclasses import dataclass  # noqa: E402

from django.db.models import Count, OuterRef, Sum  # noqa: E402

from nodes.models import SERVING_WORKER_STATUSES, Reclaim  # noqa: E402


def portal_nodes(*, provider) -> QuerySet[Node]:
    """provider_nodes plus the earliest scheduled rental reclaim, for the row's countdown."""
    from django.db.models import Min, Subquery

    from rentals.models import Rental, RentalStatus

    reclaim_at = (
        Rental.objects.filter(node=OuterRef("pk"), status=RentalStatus.RECLAIMING)
        .values("node")
        .annotate(first=Min("reclaim_at"))
        .values("first")
    )
    return provider_nodes(provider=provider).annotate(rental_reclaim_at=Subquery(reclaim_at))


@dataclass(frozen=True)
class WorkerLoad:
    id: str
    model: str
    status: str
    in_flight: int
    max_slots: int
    drain_deadline: datetime | None

    @property
    def load_percent(self) -> int:
        return min(100, round(100 * self.in_flight / self.max_slots)) if self.max_slots else 0


@dataclass(frozen=True)
class NodeSummary:
    """What a node's row shows: its derived state, what drains, and whether it is still changing."""

    node: Node
    state: str
    workers: list[WorkerLoad]
    draining_in_flight: int
    drain_deadline: datetime | None
    rental_reclaim_at: datetime | None

    @property
    def changing(self) -> bool:
        # A drain ends at zero slots or at its deadline; a rental reclaim at
        # reclaim_at: until then the row refreshes itself, afterwards it rests.
        return self.state == NodeState.DRAINING or self.rental_reclaim_at is not None

    @property
    def poll_every(self) -> str:
        """htmx's interval: a drain's in-flight count changes by the second; a rental
        reclaim only ends at reclaim_at (the countdown ticks in the browser)."""
        return "1s" if self.state == NodeState.DRAINING else "5s"

    @property
    def fingerprint(self) -> str:
        """Changes whenever the row would; a poll that sends the current one gets no body back."""
        node = self.node
        seen = (
            self.state, self.draining_in_flight, self.drain_deadline, self.rental_reclaim_at,
            [(w.id, w.status, w.in_flight, w.max_slots) for w in self.workers],
            node.name, node.is_spot, node.workload_enabled, node.rented, node.price_per_hour,
            node.cloud, node.instance_type, node.zone, node.gpu_model,
        )
        return hashlib.blake2b(repr(seen).encode(), digest_size=8).hexdigest()


def node_summary(node: Node, now: datetime | None = None) -> NodeSummary:
    """Summarise a node loaded through with_state / portal_nodes (no further queries)."""
    now = now or timezone.now()
    workers = [
        WorkerLoad(
            id=str(w.pk), model=w.model.name, status=w.status, in_flight=w.in_flight,
            max_slots=w.max_slots, drain_deadline=w.drain_deadline,
        )
        for w in node.live_workers
    ]
    draining = [w for w in workers if w.status == WorkerStatus.DRAINING]
    deadlines = [w.drain_deadline for w in draining if w.drain_deadline]
    return NodeSummary(
        node=node,
        state=node_state(node, now),
        workers=workers,
        draining_in_flight=sum(w.in_flight for w in draining),
        drain_deadline=max(deadlines) if deadlines else None,
        rental_reclaim_at=getattr(node, "rental_reclaim_at", None),
    )


@dataclass(frozen=True)
class PausePreview:
    """What Pause would do now; the service decides, this only describes it beforehand."""

    is_spot: bool
    already_paused: bool
    in_flight: int
    workers: int
    drain_deadline: datetime
    rentals: int
    rental_reclaim_at: datetime
    notice_s: float

    @property
    def notice_words(self) -> str:
        """The notice a rental gets, as the owner reads it: "two minutes'" by default."""
        words = {60: "one minute's", 120: "two minutes'", 180: "three minutes'"}
        return words.get(round(self.notice_s), f"{round(self.notice_s)} seconds'")


def pause_preview(*, node: Node, now: datetime | None = None) -> PausePreview:
    from nodes.drain import drain_deadline
    from rentals.models import Rental, RentalStatus

    now = now or timezone.now()
    serving = Worker.objects.filter(node=node, status__in=SERVING_WORKER_STATUSES)
    totals = serving.aggregate(in_flight=Sum("in_flight"), workers=Count("pk"))
    return PausePreview(
        is_spot=node.is_spot,
        already_paused=not node.workload_enabled,
        in_flight=totals["in_flight"] or 0,
        workers=totals["workers"] or 0,
        drain_deadline=drain_deadline(now),
        rentals=Rental.objects.filter(node=node, status=RentalStatus.ACTIVE).count(),
        rental_reclaim_at=now + timedelta(seconds=settings.RENTAL_NOTICE_S),
        notice_s=settings.RENTAL_NOTICE_S,
    )


def node_workers(*, node: Node, stopped_limit: int = 10) -> list[Worker]:
    """Live workers with their slots, then the most recently stopped ones."""
    from nodes.models import Slot

    slots = Slot.objects.order_by("acquired_at")
    live = list(
        Worker.objects.filter(node=node, status__in=LIVE_WORKER_STATUSES)
        .select_related("model")
        .prefetch_related(Prefetch("slots", queryset=slots, to_attr="slot_list"))
        .order_by("created_at")
    )
    stopped = list(
        Worker.objects.filter(node=node)
        .exclude(status__in=LIVE_WORKER_STATUSES)
        .select_related("model")
        .order_by("-stopped_at", "-created_at")[:stopped_limit]
    )
    for worker in stopped:
        worker.slot_list = []
    return live + stopped


def node_reclaims(*, node: Node) -> QuerySet[Reclaim]:
    """Every reclaim of the node, newest first, with its workers and events for the timeline."""
    from nodes.models import NodeEvent

    return Reclaim.objects.filter(node=node).prefetch_related(
        Prefetch("workers", queryset=Worker.objects.order_by("drain_started_at", "pk")),
        Prefetch("events", queryset=NodeEvent.objects.order_by("at", "pk")),
    ).order_by("-started_at", "-id")


def in_flight_series(reclaims: list[Reclaim], *, points: int = 12, now: datetime | None = None) -> dict[int, list[tuple[float, int]]]:
    """Requests still running at evenly spaced moments of each drain, from the router's request log.

    One query for the whole page. Only requests admitted before the drain
    started can be in flight during it (R4), and those are looked for in the
    hour before; a drain whose log was pruned gets no series.
    """
    from django.db.models import Q

    from inference.models import RequestLog

    now = now or timezone.now()
    wanted = Q(pk__in=[])
    by_reclaim: dict[int, set[str]] = {}
    for reclaim in reclaims:
        worker_ids = {str(w.pk) for w in reclaim.workers.all()}
        if not worker_ids or reclaim.in_flight_at_start == 0:
            continue
        by_reclaim[reclaim.pk] = worker_ids
        wanted |= Q(
            worker_id__in=list(worker_ids),
            admitted_at__gte=reclaim.started_at - timedelta(hours=1),
            admitted_at__lt=reclaim.started_at,
        )
    if not by_reclaim:
        return {}
    rows = list(RequestLog.objects.filter(wanted).values_list("worker_id", "admitted_at", "created_at", "duration_ms"))
    series: dict[int, list[tuple[float, int]]] = {}
    for reclaim in reclaims:
        worker_ids = by_reclaim.get(reclaim.pk)
        if worker_ids is None:
            continue
        start = reclaim.started_at
        end = reclaim.finished_at or min(now, reclaim.deadline)
        ends = [
            created + timedelta(milliseconds=duration)
            for worker_id, admitted, created, duration in rows
            if str(worker_id) in worker_ids and admitted < start
        ]
        ends = [e for e in ends if e > start]
        if not ends:
            continue
        span = max((end - start).total_seconds(), 1.0)
        series[reclaim.pk] = [
            (round(span * i / (points - 1), 1), sum(1 for e in ends if e > start + timedelta(seconds=span * i / (points - 1))))
            for i in range(points)
        ]
    return series


def offer_gpu_models() -> list[str]:
    """GPU models of enabled nodes, for the offers filter: a cheap superset of the offers' own."""
    return list(
        Node.objects.filter(workload_enabled=True)
        .exclude(gpu_model="")
        .order_by("gpu_model")
        .values_list("gpu_model", flat=True)
        .distinct()
    )


def offer_rows(queryset: QuerySet[Node], ids: list[int]) -> list[Node]:
    """The rows of one page of offers, in the page's order.

    A page is paginated as ids first (the sort needs every offer, but not their
    per-node annotations such as reliability); only its 50 rows are then read
    in full, by primary key, through the same queryset.
    """
    by_id = {node.pk: node for node in queryset.filter(pk__in=ids)}
    return [by_id[pk] for pk in ids if pk in by_id]
