"""R3: the single function that puts a model on a node, and what may run where."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, FloatField, Q
from django.db.models.functions import Cast, Greatest
from django.utils import timezone

from nodes import events
from nodes.commands import issue_command
from nodes.models import LIVE_WORKER_STATUSES, CommandKind, Node, ServedModel, Worker, WorkerStatus


def place_worker(node: Node | int, *, now: datetime | None = None) -> Worker | None:
    """Start a worker on the node if it may hold workload and has none; else return at once."""
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
        model = choose_model(node)
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


def choose_model(node: Node) -> ServedModel | None:
    """The fitting model furthest below its target replica count."""
    live = Count("workers", filter=Q(workers__status__in=[WorkerStatus.STARTING, WorkerStatus.READY]))
    return (
        ServedModel.objects.filter(min_vram_gb__lte=node.vram_gb)
        .annotate(
            live=live,
            fill=Cast(live, FloatField()) / Cast(Greatest(F("target_replicas"), 1), FloatField()),
        )
        .order_by("fill", "name")
        .first()
    )


def after_worker_stopped(*, node: Node, now: datetime) -> None:
    """Once a locked node has no live worker: hand it to its renter, or place anew."""
    from rentals.services import start_waiting_rentals

    if Worker.objects.filter(node=node, status__in=LIVE_WORKER_STATUSES).exists():
        return
    start_waiting_rentals(node=node, now=now)
    place_worker(node, now=now)
