"""R5: a drain is state in the database, not a loop in a process.

`start_node_drain` marks workers draining (the router stops admitting them in
the same commit); `finish_drain` stops a worker once its slots reach zero or
its deadline passes. Any tick of any process can call `finish_drain`: it locks
the node, then the worker, and acts only on a worker still draining, so running
it twice is harmless.
"""

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from marketplace.enqueue import enqueue_on_commit
from nodes import events
from nodes.commands import issue_command
from nodes.models import (
    SERVING_WORKER_STATUSES,
    CommandKind,
    Node,
    Reclaim,
    ReclaimTrigger,
    Slot,
    StopReason,
    Worker,
    WorkerStatus,
)


def drain_deadline(started_at: datetime, not_before: datetime | None = None) -> datetime:
    """min(start + ceiling, notice time - margin), never before the start."""
    deadline = started_at + timedelta(seconds=settings.DRAIN_CEILING_S)
    if not_before is not None:
        deadline = min(deadline, not_before - timedelta(seconds=settings.NOTICE_MARGIN_S))
    return max(deadline, started_at)


def _enqueue_finish(worker_id: Any, at: datetime | None = None) -> None:
    from nodes.tasks import finish_drain_task

    if at is None:
        enqueue_on_commit(lambda: finish_drain_task.delay(str(worker_id)), "finish_drain")
    else:
        # Due at the deadline (a hair after, so clock skew never makes it early);
        # many deadlines at once spread over the Celery workers, not one tick.
        eta = at + timedelta(milliseconds=50)
        enqueue_on_commit(lambda: finish_drain_task.apply_async(args=[str(worker_id)], eta=eta), "finish_drain")


def start_node_drain(
    *, node: Node, trigger: str, now: datetime | None = None, not_before: datetime | None = None
) -> Reclaim:
    """Drain every serving worker of a node whose row the caller holds locked."""
    now = now or timezone.now()
    reclaim = Reclaim.objects.create(
        node=node, trigger=trigger, started_at=now, deadline=drain_deadline(now, not_before)
    )
    workers = list(
        Worker.objects.select_for_update().filter(node=node, status__in=SERVING_WORKER_STATUSES).order_by("pk")
    )
    in_flight = 0
    for worker in workers:
        in_flight += start_worker_drain(worker=worker, reclaim=reclaim, now=now)
    reclaim.in_flight_at_start = in_flight
    reclaim.save(update_fields=["in_flight_at_start"])
    events.record(
        node_id=node.pk,
        kind="drain_started",
        reclaim_id=reclaim.pk,
        at=now,
        trigger=trigger,
        deadline=reclaim.deadline,
        workers=len(workers),
        in_flight=in_flight,
    )
    return reclaim


def start_worker_drain(*, worker: Worker, reclaim: Reclaim, now: datetime) -> int:
    """Mark one locked worker draining; returns its in-flight count at that moment."""
    changed = Worker.objects.filter(pk=worker.pk, status__in=SERVING_WORKER_STATUSES).update(
        status=WorkerStatus.DRAINING,
        drain_started_at=now,
        drain_deadline=reclaim.deadline,
        reclaim=reclaim,
        in_flight_at_drain=F("in_flight"),
    )
    if changed != 1:
        return 0
    worker.refresh_from_db(fields=["status", "in_flight", "in_flight_at_drain", "drain_deadline"])
    events.record(
        node_id=worker.node_id,
        kind="worker_draining",
        reclaim_id=reclaim.pk,
        worker_id=worker.pk,
        at=now,
        in_flight=worker.in_flight,
        deadline=reclaim.deadline,
    )
    # A worker with nothing in flight is stopped right after the commit, one
    # with requests at its deadline unless they finish first; the drain tick
    # remains the backstop if either message is lost.
    if worker.in_flight == 0:
        _enqueue_finish(worker.pk)
    else:
        _enqueue_finish(worker.pk, at=reclaim.deadline)
    if reclaim.trigger != ReclaimTrigger.LATE_REGISTRATION:
        # Capacity comes back while the old worker drains (R3 places it).
        from nodes.tasks import place_replacement_task

        model_id, node_id = worker.model_id, worker.node_id
        enqueue_on_commit(lambda: place_replacement_task.delay(model_id, node_id), "place_replacement")
    return worker.in_flight


def finish_drain(worker_id: Any, *, now: datetime | None = None, skip_locked: bool = False) -> bool:
    """Stop a draining worker at zero slots or at its deadline. True if it stopped it.

    With skip_locked (the tick), a node another process is working on is left to it.
    """
    node_id = Worker.objects.filter(pk=worker_id).values_list("node_id", flat=True).first()
    if node_id is None:
        return False
    with transaction.atomic():
        # Lock order everywhere: node, then worker, then slots.
        node = Node.objects.select_for_update(skip_locked=skip_locked).filter(pk=node_id).first()
        if node is None:
            return False
        # Read the clock after the lock: the stop time is when it happened.
        now = now or timezone.now()
        worker = Worker.objects.select_for_update().filter(pk=worker_id).first()
        if worker is None or worker.status != WorkerStatus.DRAINING:
            return False
        if worker.in_flight > 0 and now < worker.drain_deadline:
            return False
        cut = worker.in_flight
        reason = StopReason.CEILING if cut else StopReason.DRAINED
        stop_worker(node=node, worker=worker, reason=reason, now=now, cut=cut)
        return True


def stop_worker(*, node: Node, worker: Worker, reason: str, now: datetime, cut: int = 0) -> None:
    """Take a locked worker out of routing for good and tell its agent to stop it."""
    from nodes.placement import after_worker_stopped

    Slot.objects.filter(worker=worker).delete()
    worker.status = WorkerStatus.STOPPED if reason != StopReason.LOST else WorkerStatus.LOST
    worker.stopped_at = now
    worker.stop_reason = reason
    worker.requests_cut = cut
    worker.in_flight = 0
    worker.save(update_fields=["status", "stopped_at", "stop_reason", "requests_cut", "in_flight"])
    if reason != StopReason.LOST:
        issue_command(
            node_id=node.pk,
            kind=CommandKind.STOP_WORKER,
            worker_id=worker.pk,
            payload={"worker_id": str(worker.pk), "reason": reason, "grace_s": settings.STOP_GRACE_S},
        )
    events.record(
        node_id=node.pk,
        kind="worker_stopped",
        reclaim_id=worker.reclaim_id,
        worker_id=worker.pk,
        at=now,
        reason=reason,
        cut=cut,
        late_s=(
            round((now - worker.drain_deadline).total_seconds(), 3)
            if worker.drain_deadline and now > worker.drain_deadline
            else 0
        ),
    )
    if worker.reclaim_id:
        Reclaim.objects.filter(pk=worker.reclaim_id).update(
            completed=F("completed") + max(worker.in_flight_at_drain - cut, 0), cut=F("cut") + cut
        )
        maybe_finish_reclaim(reclaim_id=worker.reclaim_id, now=now)
    after_worker_stopped(node=node, now=now)


def maybe_finish_reclaim(*, reclaim_id: int, now: datetime | None = None) -> bool:
    """Close a reclaim once none of its workers drain and none of its rentals await their end."""
    from rentals.selectors import reclaim_has_pending_rentals

    now = now or timezone.now()
    reclaim = Reclaim.objects.filter(pk=reclaim_id, finished_at__isnull=True).first()
    if reclaim is None:
        return False
    if Worker.objects.filter(reclaim_id=reclaim_id, status=WorkerStatus.DRAINING).exists():
        return False
    if reclaim_has_pending_rentals(reclaim_id=reclaim_id):
        return False
    if Reclaim.objects.filter(pk=reclaim_id, finished_at__isnull=True).update(finished_at=now) != 1:
        return False
    events.record(node_id=reclaim.node_id, kind="reclaim_finished", reclaim_id=reclaim_id, at=now)
    return True


def _later_than(*, node: Node, not_before: datetime, now: datetime) -> tuple[datetime, datetime, Any, Any]:
    """The drain and rental deadlines a notice allows, and the node's open drains/workers set later."""
    deadline = drain_deadline(now, not_before)
    rental_deadline = max(
        min(now + timedelta(seconds=settings.RENTAL_NOTICE_S), not_before - timedelta(seconds=settings.NOTICE_MARGIN_S)),
        now,
    )
    reclaims = Reclaim.objects.filter(node=node, finished_at__isnull=True, deadline__gt=deadline)
    workers = Worker.objects.filter(node=node, status=WorkerStatus.DRAINING, drain_deadline__gt=deadline)
    return deadline, rental_deadline, reclaims, workers


def has_later_deadlines(*, node: Node, not_before: datetime, now: datetime | None = None) -> bool:
    """Whether a notice with this not_before would bring anything of a reclaimed node forward."""
    from rentals.selectors import node_reclaims_later_than

    now = now or timezone.now()
    _, rental_deadline, reclaims, workers = _later_than(node=node, not_before=not_before, now=now)
    return reclaims.exists() or workers.exists() or node_reclaims_later_than(node_id=node.pk, at=rental_deadline)


def advance_drain_deadlines(*, node: Node, not_before: datetime, now: datetime | None = None) -> int:
    """R12: a later notice with an earlier not_before brings a locked node's open drains
    (reclaims, draining workers, rental reclaims) forward, never back. Returns how many moved."""
    from rentals.services import advance_rental_reclaims

    now = now or timezone.now()
    deadline, rental_deadline, reclaims, workers = _later_than(node=node, not_before=not_before, now=now)
    moved_reclaims = list(reclaims.values_list("pk", flat=True))
    if moved_reclaims:
        Reclaim.objects.filter(pk__in=moved_reclaims, deadline__gt=deadline).update(deadline=deadline)
    moved_workers = 0
    for worker in workers.select_for_update().order_by("pk"):
        if Worker.objects.filter(pk=worker.pk, status=WorkerStatus.DRAINING, drain_deadline__gt=deadline).update(
            drain_deadline=deadline
        ):
            moved_workers += 1
            _enqueue_finish(worker.pk, at=deadline)
    moved_rentals = advance_rental_reclaims(node=node, reclaim_at=rental_deadline, now=now)
    moved = len(moved_reclaims) + moved_workers + moved_rentals
    if moved:
        events.record(
            node_id=node.pk,
            kind="drain_deadline_advanced",
            reclaim_id=moved_reclaims[0] if moved_reclaims else None,
            at=now,
            deadline=deadline,
            not_before=not_before,
            reclaims=len(moved_reclaims),
            workers=moved_workers,
            rentals=moved_rentals,
        )
    return moved
