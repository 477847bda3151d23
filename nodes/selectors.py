"""Read side of nodes: lists with derived state in a constant number of queries."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Prefetch, QuerySet
from django.utils import timezone

from nodes.models import LIVE_WORKER_STATUSES, Node, NodeState, Worker, WorkerStatus


def with_state(queryset: QuerySet[Node]) -> QuerySet[Node]:
    """Annotate `rented` and prefetch live workers, what `node_state` needs."""
    from rentals.models import OPEN_RENTAL_STATUSES, Rental

    rented = Rental.objects.filter(node=OuterRef("pk"), status__in=OPEN_RENTAL_STATUSES)
    live = Worker.objects.filter(status__in=LIVE_WORKER_STATUSES).select_related("model").order_by("created_at")
    return queryset.annotate(rented=Exists(rented)).prefetch_related(Prefetch("workers", queryset=live, to_attr="live_workers"))


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
    """Rentable nodes: enabled, online, not rented; a provider does not see their own."""
    from rentals.models import OPEN_RENTAL_STATUSES, Rental

    now = now or timezone.now()
    rented = Rental.objects.filter(node=OuterRef("pk"), status__in=OPEN_RENTAL_STATUSES)
    queryset = Node.objects.filter(
        workload_enabled=True, last_seen_at__gte=now - timedelta(seconds=settings.NODE_OFFLINE_S)
    ).filter(~Exists(rented))
    if viewer is not None and viewer.is_authenticated:
        queryset = queryset.exclude(provider=viewer)
    return queryset.order_by("price_per_hour", "id")
