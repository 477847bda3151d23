"""Slot leases: the router's in-flight requests, counted per worker (R4).

Admission is one conditional UPDATE that checks the worker's status, expiry and
free slots and takes the slot in the same statement: once a drain has
committed, the status no longer matches and no new request gets in.
"""

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from nodes.models import RouterInstance, Slot, Worker, WorkerStatus


def acquire_slot(
    *, worker_id: Any, router_instance: str, request_id: str = "", now: datetime | None = None
) -> Slot | None:
    now = now or timezone.now()
    with transaction.atomic():
        taken = Worker.objects.filter(
            pk=worker_id,
            status=WorkerStatus.READY,
            expires_at__gt=now,
            in_flight__lt=F("max_slots"),
        ).update(in_flight=F("in_flight") + 1)
        if taken != 1:
            return None
        return Slot.objects.create(
            worker_id=worker_id, router_instance=router_instance, request_id=request_id, acquired_at=now
        )


def release_slot(*, slot_id: Any, worker_id: Any) -> bool:
    """Release a lease; the last release on a draining worker finishes its drain at once."""
    with transaction.atomic():
        # Lock the worker before the slot, as finish_drain does, so the two never deadlock.
        row = Worker.objects.select_for_update().filter(pk=worker_id).values_list("status", "in_flight").first()
        if row is None:
            return False
        status, in_flight = row
        deleted, _ = Slot.objects.filter(pk=slot_id, worker_id=worker_id).delete()
        if not deleted:
            return False  # already released, or cut by the drain's deadline
        Worker.objects.filter(pk=worker_id, in_flight__gt=0).update(in_flight=F("in_flight") - 1)
        if status == WorkerStatus.DRAINING and in_flight <= 1:
            from nodes.tasks import finish_drain_task

            transaction.on_commit(lambda: finish_drain_task.delay(str(worker_id)))
    return True


def router_heartbeat(*, instance_id: str, now: datetime | None = None) -> None:
    now = now or timezone.now()
    RouterInstance.objects.update_or_create(pk=instance_id, defaults={"last_beat_at": now})


def release_dead_router_slots(*, now: datetime | None = None) -> int:
    """Release every slot whose router instance stopped beating (or never beat)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.ROUTER_EXPIRY_S)
    alive = RouterInstance.objects.filter(last_beat_at__gte=cutoff).values_list("pk", flat=True)
    orphans = Slot.objects.filter(acquired_at__lt=cutoff).exclude(router_instance__in=alive)
    released = 0
    for slot_id, worker_id in orphans.values_list("pk", "worker_id"):
        released += release_slot(slot_id=slot_id, worker_id=worker_id)
    RouterInstance.objects.filter(last_beat_at__lt=cutoff).delete()
    return released
