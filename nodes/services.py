"""Owner-facing transitions of a node: create, pause, resume, spot toggle (R1, R2, R10)."""

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from marketplace.errors import NodeRented, NotSpot
from nodes import events
from nodes.drain import advance_drain_deadlines, maybe_finish_reclaim, start_node_drain
from nodes.models import Node, Reclaim, ReclaimTrigger
from nodes.placement import place_worker
from nodes.tokens import hash_token, new_agent_token


def create_node(*, provider: AbstractBaseUser, **fields: Any) -> tuple[Node, str]:
    """Returns the node and its agent token, which is stored only as a hash."""
    token = new_agent_token()
    node = Node.objects.create(provider=provider, agent_token_hash=hash_token(token), **fields)
    events.record(node_id=node.pk, kind="node_created")
    return node, token


def rotate_agent_token(*, node: Node) -> str:
    """A new agent token for the node (the old one stops working at once); shown once."""
    token = new_agent_token()
    Node.objects.filter(pk=node.pk).update(agent_token_hash=hash_token(token))
    events.record(node_id=node.pk, kind="agent_token_rotated")
    return token


def update_node(*, node: Node, name: str | None = None, price_per_hour: Decimal | None = None) -> Node:
    fields = []
    if name is not None:
        node.name = name
        fields.append("name")
    if price_per_hour is not None:
        node.price_per_hour = price_per_hour
        fields.append("price_per_hour")
    if fields:
        node.save(update_fields=fields)
    return node


def set_spot(*, node_id: int, is_spot: bool) -> Node:
    """R10: the spot flag never changes under a rental, checked under the node's row lock."""
    from rentals.selectors import node_is_rented

    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.is_spot == is_spot:
            return node
        if node_is_rented(node_id=node.pk):
            raise NodeRented()
        node.is_spot = is_spot
        node.save(update_fields=["is_spot"])
        events.record(node_id=node.pk, kind="spot_changed", is_spot=is_spot)
    return node


def pause_node(*, node_id: int, now: datetime | None = None) -> tuple[Node, Reclaim | None]:
    """R2: workload off, every live worker draining, every rental noticed: one transaction."""
    return reclaim_node(node_id=node_id, trigger=ReclaimTrigger.OWNER_PAUSE, now=now, require_spot=True)


def reclaim_node(
    *,
    node_id: int,
    trigger: str,
    now: datetime | None = None,
    not_before: datetime | None = None,
    require_spot: bool = False,
) -> tuple[Node, Reclaim | None]:
    """The one reclaim path, for a Pause and for a cloud's notice alike. Idempotent.

    On a node already reclaimed, a notice's `not_before` can only bring the open
    drains forward (the earliest deadline wins, R12); nothing else changes.
    """
    from rentals.services import schedule_rental_reclaims

    now = now or timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if require_spot and not node.is_spot:
            raise NotSpot()
        if not node.workload_enabled:
            if not_before is not None:
                advance_drain_deadlines(node=node, not_before=not_before, now=now)
            return node, latest_reclaim(node)
        node.workload_enabled = False
        node.save(update_fields=["workload_enabled"])
        reclaim = start_node_drain(node=node, trigger=trigger, now=now, not_before=not_before)
        reclaim.rentals_noticed = schedule_rental_reclaims(node=node, reclaim=reclaim, now=now, not_before=not_before)
        reclaim.save(update_fields=["rentals_noticed"])
        if not_before is not None and (
            Reclaim.objects.filter(node=node, finished_at__isnull=True).exclude(pk=reclaim.pk).exists()
        ):
            # Workers still draining for an earlier reason (a rental's start) must stop in time too.
            advance_drain_deadlines(node=node, not_before=not_before, now=now)
        events.record(node_id=node.pk, kind="workload_disabled", reclaim_id=reclaim.pk, at=now, trigger=trigger)
        maybe_finish_reclaim(reclaim_id=reclaim.pk, now=now)
    return node, reclaim


def resume_node(*, node_id: int, now: datetime | None = None) -> Node:
    """R2: workload on, pending rental reclaims cancelled; placement once drains have stopped."""
    from rentals.services import cancel_rental_reclaims

    now = now or timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.workload_enabled:
            return node
        node.workload_enabled = True
        node.save(update_fields=["workload_enabled"])
        cancelled = cancel_rental_reclaims(node=node, now=now)
        open_reclaims = list(
            Reclaim.objects.filter(node=node, finished_at__isnull=True).values_list("pk", flat=True)
        )
        Reclaim.objects.filter(pk__in=open_reclaims).update(resumed_at=now)
        for reclaim_id in open_reclaims:
            maybe_finish_reclaim(reclaim_id=reclaim_id, now=now)
        events.record(node_id=node.pk, kind="workload_enabled", at=now, rental_reclaims_cancelled=cancelled)
        # Returns at once while a drain is still running: a drain, once begun,
        # always ends by stopping its worker, and that stop places anew.
        place_worker(node, now=now)
    return node


def latest_reclaim(node: Node) -> Reclaim | None:
    return (
        Reclaim.objects.filter(node=node)
        .exclude(trigger=ReclaimTrigger.RENTAL_START)
        .order_by("-started_at", "-id")
        .first()
    )


def mark_node_at_risk(*, node_id: int, until: datetime, now: datetime | None = None) -> bool:
    """A cloud's rebalance recommendation: no new work is placed on the node until `until`.

    The mark clears by itself when the time passes. A node already marked keeps
    its first mark (a repeated signal changes nothing). True if it marked the node.
    """
    now = now or timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.at_risk_until is not None and node.at_risk_until > now:
            return False
        node.at_risk_until = until
        node.save(update_fields=["at_risk_until"])
        events.record(node_id=node.pk, kind="marked_at_risk", at=now, until=until)
    return True
