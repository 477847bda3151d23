"""Rental transitions: start, end, and the reclaim notice of R2 and R13."""

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from marketplace.enqueue import enqueue_on_commit
from marketplace.errors import NodeUnavailable, RentalEnded
from nodes import events
from nodes.commands import issue_command
from nodes.drain import maybe_finish_reclaim, start_node_drain
from nodes.models import LIVE_WORKER_STATUSES, SERVING_WORKER_STATUSES, CommandKind, Node, Reclaim, ReclaimTrigger, Worker
from nodes.placement import place_worker
from rentals.models import OPEN_RENTAL_STATUSES, EndReason, Rental, RentalStatus
from rentals.selectors import node_is_rented


def start_rental(
    *, renter: AbstractBaseUser, node_id: int, hours: float | None = None, now: datetime | None = None
) -> Rental:
    now = now or timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(pk=node_id).first()
        if node is None:
            raise NodeUnavailable("No such node.")
        if node.provider_id == renter.pk:
            raise NodeUnavailable("You cannot rent your own node.")
        if not node.workload_enabled:
            raise NodeUnavailable("The node is paused by its owner.")
        if not node.is_online(now):
            raise NodeUnavailable("The node is offline.")
        if node_is_rented(node_id=node.pk):
            raise NodeUnavailable("The node is already rented.")
        rental = Rental.objects.create(
            node=node,
            renter=renter,
            is_spot=node.is_spot,  # R10: fixed here, under the node's lock, for good
            started_at=now,
            term_ends_at=now + timedelta(hours=hours) if hours else None,
        )
        events.record(node_id=node.pk, kind="rental_started", at=now, rental_id=rental.pk, is_spot=rental.is_spot)
        if Worker.objects.filter(node=node, status__in=SERVING_WORKER_STATUSES).exists():
            # The node's inference workers drain first; start_rental follows their stop.
            start_node_drain(node=node, trigger=ReclaimTrigger.RENTAL_START, now=now)
        else:
            start_waiting_rentals(node=node, now=now)
    return rental


def start_waiting_rentals(*, node: Node, now: datetime) -> int:
    """Send start_rental for a locked node's rental once no worker of the node is live."""
    if Worker.objects.filter(node=node, status__in=LIVE_WORKER_STATUSES).exists():
        return 0
    waiting = list(
        Rental.objects.select_for_update().filter(
            node=node, status=RentalStatus.ACTIVE, start_commanded_at__isnull=True
        )
    )
    for rental in waiting:
        issue_command(node_id=node.pk, kind=CommandKind.START_RENTAL, payload={"rental_id": rental.pk})
        rental.start_commanded_at = now
        rental.save(update_fields=["start_commanded_at"])
    return len(waiting)


def start_all_waiting_rentals(*, now: datetime | None = None) -> int:
    now = now or timezone.now()
    live = Worker.objects.filter(node=OuterRef("node_id"), status__in=LIVE_WORKER_STATUSES)
    node_ids = set(
        Rental.objects.filter(status=RentalStatus.ACTIVE, start_commanded_at__isnull=True)
        .filter(~Exists(live))
        .values_list("node_id", flat=True)[:500]
    )
    started = 0
    for node_id in node_ids:
        with transaction.atomic():
            node = Node.objects.select_for_update(skip_locked=True).filter(pk=node_id).first()
            if node is not None:
                started += start_waiting_rentals(node=node, now=now)
    return started


def schedule_rental_reclaims(
    *, node: Node, reclaim: Reclaim, now: datetime, not_before: datetime | None = None
) -> int:
    """R2: every active rental of a locked node gets reclaim_at = now + notice, or
    earlier when a cloud's notice says the machine goes before that (R12)."""
    reclaim_at = now + timedelta(seconds=settings.RENTAL_NOTICE_S)
    if not_before is not None:
        reclaim_at = max(min(reclaim_at, not_before - timedelta(seconds=settings.NOTICE_MARGIN_S)), now)
    rentals = list(Rental.objects.select_for_update().filter(node=node, status=RentalStatus.ACTIVE))
    for rental in rentals:
        rental.status = RentalStatus.RECLAIMING
        rental.reclaim_at = reclaim_at
        rental.reclaim = reclaim
        rental.save(update_fields=["status", "reclaim_at", "reclaim"])
        events.record(
            node_id=node.pk, kind="rental_noticed", reclaim_id=reclaim.pk, at=now, rental_id=rental.pk, reclaim_at=reclaim_at
        )
    return len(rentals)


def advance_rental_reclaims(*, node: Node, reclaim_at: datetime, now: datetime) -> int:
    """R12: a cloud's earlier notice brings a locked node's rental reclaims forward, never back."""
    rentals = list(
        Rental.objects.select_for_update().filter(node=node, status=RentalStatus.RECLAIMING, reclaim_at__gt=reclaim_at)
    )
    for rental in rentals:
        rental.reclaim_at = reclaim_at
        rental.save(update_fields=["reclaim_at"])
        events.record(
            node_id=node.pk, kind="rental_reclaim_advanced", reclaim_id=rental.reclaim_id, at=now,
            rental_id=rental.pk, reclaim_at=reclaim_at,
        )
    return len(rentals)


def cancel_rental_reclaims(*, node: Node, now: datetime) -> int:
    """R2: reclaims not yet carried out are cancelled; the notice URL answers 404 again."""
    rentals = list(Rental.objects.select_for_update().filter(node=node, status=RentalStatus.RECLAIMING))
    for rental in rentals:
        rental.status = RentalStatus.ACTIVE
        rental.reclaim_at = None
        rental.save(update_fields=["status", "reclaim_at"])
        events.record(node_id=node.pk, kind="rental_reclaim_cancelled", reclaim_id=rental.reclaim_id, at=now, rental_id=rental.pk)
    return len(rentals)


def end_rental(
    *, rental_id: int, reason: str, now: datetime | None = None, only_if_due: bool = False
) -> Rental:
    """End a rental, tell the agent, and let placement have the node (R3)."""
    now = now or timezone.now()
    node_id = Rental.objects.filter(pk=rental_id).values_list("node_id", flat=True).first()
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        rental = Rental.objects.select_for_update().get(pk=rental_id)
        if rental.status == RentalStatus.ENDED:
            if only_if_due:
                return rental
            raise RentalEnded()
        if only_if_due and not _is_due(rental, reason, now):
            return rental  # cancelled by a resume, or ended, since it was found due
        rental.status = RentalStatus.ENDED
        rental.ended_at = now
        rental.end_reason = reason
        rental.save(update_fields=["status", "ended_at", "end_reason"])
        at = rental.reclaim_at if reason == EndReason.SPOT_RECLAIM and rental.reclaim_at else now
        issue_command(
            node_id=node.pk, kind=CommandKind.STOP_RENTAL, payload={"rental_id": rental.pk, "at": at.isoformat()}
        )
        events.record(
            node_id=node.pk, kind="rental_ended", reclaim_id=rental.reclaim_id, at=now, rental_id=rental.pk, reason=reason
        )
        if rental.reclaim_id:
            maybe_finish_reclaim(reclaim_id=rental.reclaim_id, now=now)
        place_worker(node, now=now)
        # R11: the node's and provider's scores move as soon as this commits.
        from reputation.tasks import rescore_node_task

        enqueue_on_commit(lambda: rescore_node_task.delay(node_id), "rescore_node")
    return rental


def _is_due(rental: Rental, reason: str, now: datetime) -> bool:
    if reason in (EndReason.SPOT_RECLAIM, EndReason.NODE_LOST):
        return rental.status == RentalStatus.RECLAIMING and rental.reclaim_at is not None and rental.reclaim_at <= now
    if reason == EndReason.TERM:
        return rental.status in OPEN_RENTAL_STATUSES and rental.term_ends_at is not None and rental.term_ends_at <= now
    return True


def carry_out_due_rentals(*, now: datetime | None = None) -> dict[str, Any]:
    """Rental tick: reclaims whose reclaim_at has come, and terms that ran out."""
    now = now or timezone.now()
    reclaimed = 0
    due = Rental.objects.filter(status=RentalStatus.RECLAIMING, reclaim_at__lte=now).values_list("pk", "is_spot")
    for rental_id, is_spot in list(due[:500]):
        reason = EndReason.SPOT_RECLAIM if is_spot else EndReason.NODE_LOST
        rental = end_rental(rental_id=rental_id, reason=reason, now=now, only_if_due=True)
        reclaimed += rental.ended_at == now
    termed = 0
    for rental_id in list(
        Rental.objects.filter(status=RentalStatus.ACTIVE, term_ends_at__lte=now).values_list("pk", flat=True)[:500]
    ):
        rental = end_rental(rental_id=rental_id, reason=EndReason.TERM, now=now, only_if_due=True)
        termed += rental.ended_at == now
    return {"reclaimed": reclaimed, "term": termed}
