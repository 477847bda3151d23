"""What a node's agent tells us: hello, heartbeats, worker registration (R7, R9).

A heartbeat only ever refreshes an expiry and moves `starting` to `ready`,
each a conditional UPDATE on the status, so no heartbeat, however late or
however many at once, can move a worker out of `draining` or `stopped`.
"""

import json
import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from marketplace import metrics
from marketplace.errors import NotFound, UnknownModel, WorkerNotOnNode
from nodes import events
from nodes.commands import pending_commands
from nodes.drain import start_node_drain, stop_worker
from nodes.models import (
    LIVE_WORKER_STATUSES,
    SERVING_WORKER_STATUSES,
    Node,
    ReclaimTrigger,
    ServedModel,
    StopReason,
    Worker,
    WorkerStatus,
)
from nodes.placement import place_worker

log = logging.getLogger(__name__)


def _expiry(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.WORKER_EXPIRY_S)


def hello(
    *,
    node: Node,
    hardware: dict[str, Any],
    cloud: dict[str, Any],
    running_worker_ids: list[str] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """An agent (re)starts: record its hardware and pool, forget workers it no longer runs, place."""
    now = now or timezone.now()
    running = {str(w) for w in running_worker_ids or []}
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        for field in ("gpu_model", "gpu_count", "vram_gb"):
            if hardware.get(field) is not None:
                setattr(node, field, hardware[field])
        for field, key in (
            ("cloud", "provider"),
            ("cloud_instance_id", "instance_id"),
            ("instance_type", "instance_type"),
            ("region", "region"),
            ("zone", "zone"),
        ):
            if cloud.get(key):
                setattr(node, field, cloud[key])
        node.last_seen_at = now
        node.save()
        # A restarted agent no longer runs the workers it does not name: they are gone.
        gone = Worker.objects.select_for_update().filter(node=node, status__in=LIVE_WORKER_STATUSES)
        for worker in gone:
            if str(worker.pk) in running:
                continue
            cut = worker.in_flight
            stop_worker(node=node, worker=worker, reason=StopReason.LOST, now=now, cut=cut)
        events.record(node_id=node.pk, kind="agent_hello", at=now, hardware=hardware)
        place_worker(node, now=now)
    return {
        "node_id": node.pk,
        "heartbeat_interval_s": settings.HEARTBEAT_INTERVAL_S,
        "commands": pending_commands(node_id=node.pk, now=now),
    }


def count_heartbeat(previous: datetime | None, now: datetime) -> None:
    """R15: heartbeats received, and those that came late (more than two intervals apart)."""
    metrics.HEARTBEATS.inc()
    if previous is not None and (now - previous).total_seconds() > 2 * settings.HEARTBEAT_INTERVAL_S:
        metrics.HEARTBEATS_LATE.inc()


def heartbeat(
    *, node: Node, workers: list[dict[str, Any]], now: datetime | None = None
) -> dict[str, Any]:
    now = now or timezone.now()
    count_heartbeat(node.last_seen_at, now)
    reported = {str(w["id"]): w for w in workers}
    known = {
        str(pk): (node_id, status)
        for pk, node_id, status in Worker.objects.filter(pk__in=list(reported)).values_list("pk", "node_id", "status")
    }
    if any(node_id != node.pk for node_id, _ in known.values()):
        # Refused before anything is written, as PG_HEARTBEAT_SQL does (R14).
        raise WorkerNotOnNode()
    Node.objects.filter(pk=node.pk).update(last_seen_at=now)
    if known:
        Worker.objects.filter(pk__in=list(known), status__in=LIVE_WORKER_STATUSES).update(expires_at=_expiry(now))
    to_promote = [
        pk for pk, (_, status) in known.items() if status == WorkerStatus.STARTING and reported[pk].get("status") == "ready"
    ]
    if to_promote:
        promoted = Worker.objects.filter(pk__in=to_promote, status=WorkerStatus.STARTING).update(
            status=WorkerStatus.READY, ready_at=now
        )
        if promoted == len(to_promote):
            for pk in to_promote:
                known[pk] = (node.pk, WorkerStatus.READY)
        else:
            # A drain committed in between: read back what the platform decided.
            for pk, status in Worker.objects.filter(pk__in=to_promote).values_list("pk", "status"):
                known[str(pk)] = (node.pk, status)
    reply_workers = []
    for pk in reported:
        if pk in known:
            status = known[pk][1]
            live = status in LIVE_WORKER_STATUSES
            reply_workers.append({"id": pk, "status": status, "expires_at": _expiry(now) if live else None})
        else:
            reply_workers.append({"id": pk, "status": "unknown", "expires_at": None})
    return {
        "workers": reply_workers,
        "commands": pending_commands(node_id=node.pk, now=now),
        "heartbeat_interval_s": settings.HEARTBEAT_INTERVAL_S,
    }


def register_worker(
    *,
    node: Node,
    model: str,
    endpoint: str,
    max_slots: int,
    worker_id: Any = None,
    now: datetime | None = None,
) -> Worker:
    """A worker is up on the node. R9: on a node whose workload is off it is drained at once."""
    from rentals.selectors import node_is_rented

    now = now or timezone.now()
    served = ServedModel.objects.filter(name=model).first()
    if served is None:
        raise UnknownModel(f"The platform does not serve the model {model!r}.")
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        if worker_id is not None:
            worker = Worker.objects.select_for_update().filter(pk=worker_id).first()
            if worker is None:
                raise NotFound("No such worker; register without worker_id to create one.")
            if worker.node_id != node.pk:
                raise WorkerNotOnNode()
            if worker.status not in SERVING_WORKER_STATUSES:
                return worker  # draining, stopped or lost: the platform's word stands
            worker.model = served
            worker.endpoint = endpoint
            worker.max_slots = max_slots
            worker.expires_at = _expiry(now)
            if worker.status == WorkerStatus.STARTING:
                worker.status = WorkerStatus.READY
                worker.ready_at = now
            worker.save(update_fields=["model", "endpoint", "max_slots", "expires_at", "status", "ready_at"])
        else:
            worker = Worker.objects.create(
                node=node,
                model=served,
                endpoint=endpoint,
                max_slots=max_slots,
                status=WorkerStatus.READY,
                ready_at=now,
                expires_at=_expiry(now),
            )
        node.last_seen_at = now
        node.save(update_fields=["last_seen_at"])
        events.record(node_id=node.pk, kind="worker_registered", worker_id=worker.pk, at=now, endpoint=endpoint)
        if not node.workload_enabled:
            start_node_drain(node=node, trigger=ReclaimTrigger.LATE_REGISTRATION, now=now)
        elif node_is_rented(node_id=node.pk):
            start_node_drain(node=node, trigger=ReclaimTrigger.RENTAL_START, now=now)
        worker.refresh_from_db(fields=["status"])
    return worker


def expire_workers(*, now: datetime | None = None) -> dict[str, Any]:
    """Heartbeat guard: serving workers silent past their expiry become `lost`.

    When more than MASS_STALE_FRACTION of the fleet goes silent at once, the
    fault is most likely ours (network, database, web tier), not the nodes':
    we log an alert and wait rather than mass-reclaim.
    """
    now = now or timezone.now()
    serving = Worker.objects.filter(status__in=SERVING_WORKER_STATUSES)
    expired_ids = list(serving.filter(expires_at__lt=now).values_list("pk", flat=True)[:5000])
    if not expired_ids:
        return {"lost": 0, "held": False}
    total = serving.count()
    if total >= settings.MASS_STALE_MIN_WORKERS and len(expired_ids) > settings.MASS_STALE_FRACTION * total:
        log.error("mass_stale_alert stale=%d of %d workers; not marking them lost", len(expired_ids), total)
        return {"lost": 0, "held": True, "stale": len(expired_ids), "total": total}
    lost = 0
    for worker_id in expired_ids:
        lost += mark_worker_lost(worker_id=worker_id, now=now)
    return {"lost": lost, "held": False}


def mark_worker_lost(*, worker_id: Any, now: datetime) -> bool:
    node_id = Worker.objects.filter(pk=worker_id).values_list("node_id", flat=True).first()
    if node_id is None:
        return False
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        worker = Worker.objects.select_for_update().filter(
            pk=worker_id, status__in=SERVING_WORKER_STATUSES, expires_at__lt=now
        ).first()
        if worker is None:
            return False  # a heartbeat or another guard got there first
        stop_worker(node=node, worker=worker, reason=StopReason.LOST, now=now, cut=worker.in_flight)
    log.warning("worker_lost node=%s worker=%s", node_id, worker_id)
    return True


# --- The same heartbeat in one statement, for PostgreSQL --------------------------
#
# `heartbeat()` above is the reference; the agent fast path (nodes/agent_fastpath.py)
# runs this statement instead, and the tests hold both to the same cases. R7 holds
# by the same means: the worker UPDATE's SET re-reads the row it finally locks, so
# after a drain commits, `status` stays `draining` whatever the agent reported.
PG_HEARTBEAT_SQL = """
WITH req AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(ready)s::bool[]) AS r(id, ready)
), previous AS (
    SELECT last_seen_at FROM nodes_node WHERE id = %(node)s
), foreign_worker AS (
    SELECT 1 FROM nodes_worker w JOIN req ON req.id = w.id WHERE w.node_id <> %(node)s LIMIT 1
), seen AS (
    UPDATE nodes_node SET last_seen_at = now()
    WHERE id = %(node)s AND NOT EXISTS (SELECT 1 FROM foreign_worker)
    RETURNING id
), touched AS (
    UPDATE nodes_worker w SET
        expires_at = now() + make_interval(secs => %(expiry_s)s),
        status = CASE WHEN w.status = 'starting' AND req.ready THEN 'ready' ELSE w.status END,
        ready_at = CASE WHEN w.status = 'starting' AND req.ready THEN now() ELSE w.ready_at END
    FROM req, seen
    WHERE w.id = req.id AND w.node_id = seen.id AND w.status IN ('starting', 'ready', 'draining')
    RETURNING w.id, w.status, w.expires_at
), settled AS (
    SELECT w.id, w.status FROM nodes_worker w JOIN req ON req.id = w.id, seen
    WHERE w.node_id = seen.id AND w.status NOT IN ('starting', 'ready', 'draining')
), delivered AS (
    UPDATE nodes_command c
    SET delivery_count = c.delivery_count + 1, first_delivered_at = COALESCE(c.first_delivered_at, now())
    FROM seen WHERE c.node_id = seen.id AND c.acked_at IS NULL
    RETURNING c.id, c.kind, c.payload, c.created_at
)
SELECT 'worker', id::text, status, expires_at, NULL, NULL FROM touched
UNION ALL SELECT 'worker', id::text, status, NULL, NULL, NULL FROM settled
UNION ALL SELECT 'command', id::text, kind, created_at, payload::text, NULL FROM delivered
UNION ALL SELECT 'node', seen.id::text, NULL, previous.last_seen_at, NULL, NULL FROM seen, previous
UNION ALL SELECT 'foreign', NULL, NULL, NULL, NULL, NULL FROM foreign_worker
"""


def heartbeat_params(*, node_id: int, workers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "node": node_id,
        "ids": [str(w["id"]) for w in workers],
        "ready": [w.get("status") == "ready" for w in workers],
        "expiry_s": settings.WORKER_EXPIRY_S,
    }


def heartbeat_reply(rows: list[tuple], workers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Shape the statement's rows as `heartbeat()` replies; None when it changed nothing
    (an unknown node or another node's worker), so the caller lets the reference path answer."""
    kinds = {row[0] for row in rows}
    if "foreign" in kinds or "node" not in kinds:
        return None
    statuses = {row[1]: (row[2], row[3]) for row in rows if row[0] == "worker"}
    commands = sorted((row for row in rows if row[0] == "command"), key=lambda row: row[3])
    reply_workers = []
    for w in workers:
        status, expires_at = statuses.get(str(w["id"]), ("unknown", None))
        reply_workers.append({"id": str(w["id"]), "status": status, "expires_at": expires_at})
    return {
        "workers": reply_workers,
        "commands": [{"id": row[1], "kind": row[2], "payload": json.loads(row[4])} for row in commands],
        "heartbeat_interval_s": settings.HEARTBEAT_INTERVAL_S,
    }
