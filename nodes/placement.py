"""R3: the single function that puts a model on a node, and what may run where."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Case, Count, Exists, F, FloatField, IntegerField, OuterRef, Q, Value, When
from django.db.models.functions import Cast, Greatest
from django.utils import timezone

from nodes import events
from nodes.commands import issue_command
from nodes.models import (
    LIVE_WORKER_STATUSES,
    CommandKind,
    Node,
    Reclaim,
    ReclaimTrigger,
    ServedModel,
    Worker,
    WorkerStatus,
)


def place_worker(
    node: Node | int, *, now: datetime | None = None, model: ServedModel | None = None
) -> Worker | None:
    """Start a worker on the node if it may hold workload and has none; else return at once.

    `model` asks for that model (a warm replacement); otherwise the node gets the
    fitting model furthest below its targets.
    """
    from rentals.selectors import node_is_rented

    now = now or timezone.now()
    node_id = node if isinstance(node, int) else node.pk
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if not node.workload_enabled or not node.is_online(now):
            return None
        if node_is_rented(node_id=node.pk):
            return None
        if Worker.objects.filter(node=node, status__in=LIVE_WORKER_STATUSES).exists():
            return None
        if is_avoided(node, now=now):
            return None
        if model is None:
            model = choose_model(node)
        elif model.min_vram_gb > node.vram_gb:
            return None
        if model is None:
            return None
        worker = Worker.objects.create(
            node=node,
            model=model,
            status=WorkerStatus.STARTING,
            max_slots=model.max_slots,
            expires_at=now + timedelta(seconds=settings.WORKER_EXPIRY_S),
        )
        issue_command(
            node_id=node.pk,
            kind=CommandKind.START_WORKER,
            worker_id=worker.pk,
            payload={"worker_id": str(worker.pk), "model": model.name},
        )
        events.record(node_id=node.pk, kind="worker_placed", worker_id=worker.pk, at=now, model=model.name)
        return worker


def _recent_preemptions(now: datetime):
    since = now - timedelta(seconds=settings.POOL_AVOID_AFTER_INTERRUPTION_S)
    return Reclaim.objects.filter(trigger=ReclaimTrigger.PREEMPTION, started_at__gte=since)


def is_avoided(node: Node, *, now: datetime) -> bool:
    """No new work for a node a cloud marked at risk (a rebalance recommendation), nor for a
    spot node of a capacity pool the cloud preempted in the last few minutes (Karpenter's 3)."""
    if node.at_risk_until is not None and node.at_risk_until > now:
        return True
    if not node.is_spot or not node.cloud:
        return False  # no cloud, no capacity pool: an owner's machine says nothing of its neighbours
    return (
        _recent_preemptions(now)
        .filter(node__cloud=node.cloud, node__instance_type=node.instance_type, node__zone=node.zone)
        .exists()
    )


def avoided_q(*, now: datetime) -> Q:
    """`is_avoided` for querysets of nodes."""
    same_pool = _recent_preemptions(now).filter(
        node__cloud=OuterRef("cloud"), node__instance_type=OuterRef("instance_type"), node__zone=OuterRef("zone")
    )
    return Q(at_risk_until__gt=now) | (Q(is_spot=True) & ~Q(cloud="") & Q(Exists(same_pool)))


def choose_model(node: Node) -> ServedModel | None:
    """The fitting model furthest below its target replica count; on an on-demand
    node, a model short of its on-demand floor comes first."""
    serving = Q(workers__status__in=[WorkerStatus.STARTING, WorkerStatus.READY])
    live = Count("workers", filter=serving)
    on_demand = Count("workers", filter=serving & Q(workers__node__is_spot=False))
    queryset = ServedModel.objects.filter(min_vram_gb__lte=node.vram_gb).annotate(
        live=live,
        fill=Cast(live, FloatField()) / Cast(Greatest(F("target_replicas"), 1), FloatField()),
        floor_short=Greatest(F("min_on_demand_replicas") - on_demand, 0),
    )
    order = ["fill", "name"] if node.is_spot else ["-floor_short", "fill", "name"]
    return queryset.order_by(*order).first()


def place_replacement(*, model_id: int, instead_of_node_id: int, now: datetime | None = None) -> Worker | None:
    """A warm replacement for a draining worker: the same model on another idle node,
    on-demand before spot, another capacity pool before the same one, cheapest first."""
    from rentals.selectors import rented_q

    now = now or timezone.now()
    model = ServedModel.objects.filter(pk=model_id).first()
    origin = Node.objects.filter(pk=instead_of_node_id).first()
    if model is None or origin is None:
        return None
    live = Worker.objects.filter(node=OuterRef("pk"), status__in=LIVE_WORKER_STATUSES)
    same_pool = Q(cloud=origin.cloud, instance_type=origin.instance_type, zone=origin.zone)
    candidates = (
        Node.objects.filter(
            workload_enabled=True,
            last_seen_at__gte=now - timedelta(seconds=settings.NODE_OFFLINE_S),
            vram_gb__gte=model.min_vram_gb,
        )
        .exclude(pk=origin.pk)
        .filter(~Exists(live))
        .exclude(rented_q())
        .exclude(avoided_q(now=now))
        .annotate(same_pool=Case(When(same_pool, then=Value(1)), default=Value(0), output_field=IntegerField()))
        .order_by("is_spot", "same_pool", "price_per_hour", "pk")
        .values_list("pk", flat=True)[:20]
    )
    for node_id in list(candidates):
        worker = place_worker(node_id, now=now, model=model)
        if worker is not None:
            events.record(
                node_id=node_id, kind="warm_replacement", worker_id=worker.pk, at=now,
                model=model.name, instead_of_node=instead_of_node_id,
            )
            return worker
    return None


def after_worker_stopped(*, node: Node, now: datetime) -> None:
    """Once a locked node has no live worker: hand it to its renter, or place anew."""
    from rentals.render import start_waiting_renders
    from rentals.services import start_waiting_rentals

    if Worker.objects.filter(node=node, status__in=LIVE_WORKER_STATUSES).exists():
        return
    start_waiting_rentals(node=node, now=now)
    start_waiting_renders(node=node, now=now)
    place_worker(node, now=now)


def pick_render_node(*, now: datetime | None = None) -> int | None:
    """Where a render job may run: an enabled, online, on-demand node that no rental or
    render job holds; nodes without inference workers first, then the cheapest. Never
    a spot node (R3): `claim_render_node` checks again under the node's lock."""
    from rentals.selectors import rented_q

    now = now or timezone.now()
    live = Worker.objects.filter(node=OuterRef("pk"), status__in=LIVE_WORKER_STATUSES)
    return (
        Node.objects.filter(
            is_spot=False,
            workload_enabled=True,
            last_seen_at__gte=now - timedelta(seconds=settings.NODE_OFFLINE_S),
        )
        .exclude(rented_q())
        .annotate(busy=Exists(live))
        .order_by("busy", "price_per_hour", "pk")
        .values_list("pk", flat=True)
        .first()
    )


def may_run_render(node: Node, *, now: datetime) -> bool:
    """The same rule as pick_render_node, for a node whose row the caller holds locked."""
    from rentals.selectors import node_is_rented

    return not node.is_spot and node.workload_enabled and node.is_online(now) and not node_is_rented(node_id=node.pk)
