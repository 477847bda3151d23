"""Slot leases: the router's in-flight requests, counted per worker (R4).

Admission is one conditional UPDATE that checks the worker's status, expiry and
free slots and takes the slot in the same statement: once a drain has
committed, the status no longer matches and no new request gets in.
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from marketplace.enqueue import enqueue_on_commit
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

            enqueue_on_commit(lambda: finish_drain_task.delay(str(worker_id)), "finish_drain")
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


# --- Admission by model, for the router ---------------------------------------
#
# The router's hot path. `admit` (ORM, any database) and `PG_ADMIT_SQL` (one
# round trip on PostgreSQL, used by the router's async pool) apply the same
# rule as `acquire_slot`: the worker is `ready`, unexpired and has a free slot,
# checked by the UPDATE that takes the slot. Least loaded first, random among
# equals; spot workers last for long jobs. Tests run both against the same cases.


@dataclass(frozen=True)
class Admission:
    slot_id: str
    worker_id: str
    endpoint: str
    node_id: int
    is_spot: bool
    acquired_at: datetime


def admit(
    *,
    model_id: int,
    router_instance: str,
    request_id: str = "",
    exclude: Sequence[str] = (),
    prefer_on_demand: bool = False,
) -> Admission | None:
    now = timezone.now()
    candidates = list(
        Worker.objects.filter(
            model_id=model_id, status=WorkerStatus.READY, expires_at__gt=now, in_flight__lt=F("max_slots")
        )
        .exclude(pk__in=list(exclude))
        .values_list("pk", "in_flight", "node__is_spot")
    )
    random.shuffle(candidates)
    candidates.sort(key=lambda c: ((prefer_on_demand and c[2]), c[1]))
    for worker_id, _, _ in candidates:
        slot = acquire_slot(worker_id=worker_id, router_instance=router_instance, request_id=request_id, now=now)
        if slot is not None:
            endpoint, node_id, is_spot = Worker.objects.filter(pk=worker_id).values_list(
                "endpoint", "node_id", "node__is_spot"
            ).get()
            return Admission(str(slot.pk), str(worker_id), endpoint, node_id, is_spot, slot.acquired_at)
    return None


PG_ADMIT_SQL = """
WITH cand AS (
    SELECT w.id
    FROM nodes_worker w JOIN nodes_node n ON n.id = w.node_id
    WHERE w.model_id = %(model_id)s AND w.status = 'ready' AND w.expires_at > now()
      AND w.in_flight < w.max_slots AND NOT (w.id = ANY(%(exclude)s::uuid[]))
    ORDER BY (%(prefer_on_demand)s AND n.is_spot), w.in_flight, random()
    LIMIT 1
), taken AS (
    -- Re-checked after any lock wait: a drain committed meanwhile leaves no row.
    UPDATE nodes_worker w SET in_flight = w.in_flight + 1
    FROM cand
    WHERE w.id = cand.id AND w.status = 'ready' AND w.expires_at > now() AND w.in_flight < w.max_slots
    RETURNING w.id, w.node_id, w.endpoint
), slot AS (
    INSERT INTO nodes_slot (id, worker_id, router_instance, request_id, acquired_at)
    SELECT gen_random_uuid(), taken.id, %(router)s, %(request_id)s, now() FROM taken
    RETURNING id, worker_id, acquired_at
)
SELECT slot.id::text, slot.worker_id::text, taken.endpoint, taken.node_id, n.is_spot, slot.acquired_at
FROM slot JOIN taken ON taken.id = slot.worker_id JOIN nodes_node n ON n.id = taken.node_id
"""

PG_ROUTER_BEAT_SQL = """
INSERT INTO nodes_routerinstance (id, started_at, last_beat_at) VALUES (%(router)s, now(), now())
ON CONFLICT (id) DO UPDATE SET last_beat_at = now()
"""

PG_ROUTER_SLOTS_SQL = "SELECT id::text FROM nodes_slot WHERE router_instance = %(router)s"

# Many releases in one statement (the router batches them under load). Workers
# are locked in id order, as start_node_drain locks them, so two batches never
# deadlock; each worker's lock is taken before its slots are deleted.
PG_RELEASE_MANY_SQL = """
WITH req AS (
    SELECT * FROM unnest(%(slot_ids)s::uuid[], %(worker_ids)s::uuid[]) AS r(slot_id, worker_id)
), locked AS (
    SELECT w.id FROM nodes_worker w
    WHERE w.id IN (SELECT worker_id FROM req) ORDER BY w.id FOR UPDATE
), gone AS (
    DELETE FROM nodes_slot s USING req, locked
    WHERE s.id = req.slot_id AND s.worker_id = req.worker_id AND locked.id = s.worker_id
    RETURNING s.worker_id
), counts AS (
    SELECT worker_id, count(*) AS n FROM gone GROUP BY worker_id
)
UPDATE nodes_worker w SET in_flight = GREATEST(w.in_flight - counts.n, 0)
FROM counts WHERE w.id = counts.worker_id
RETURNING w.id::text, w.status, w.in_flight
"""
