"""R12: a cloud's notice matched to its node and handled per mode.

- off: not consulted; only the receipt is counted.
- shadow: a ShadowReclaim with the predicted drain; nothing is rerouted.
- prod: `nodes.services.reclaim_node(trigger=preemption, not_before=...)`, the
  one reclaim path a Pause takes too, deadline min(start + 120 s, not_before - margin).

Idempotent by state, not only by id. A notice is handled in one transaction
that first locks its node's row, so notices for one node (three webhooks and
the agent at once) take turns; each then sees what the others did. The same
(source, external id) is the same row; another id for an interruption the
node's state already holds changes nothing and answers duplicate: true. The
only thing a later notice can still change is to bring the deadline forward.
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Case, F, IntegerField, Max, Value, When
from django.db.models.functions import Lower
from django.utils import timezone

from nodes.drain import drain_deadline, has_later_deadlines
from nodes.models import SERVING_WORKER_STATUSES, Node, ReclaimTrigger, Slot, Worker
from nodes.services import latest_reclaim, mark_node_at_risk, reclaim_node
from preemption import adapters
from preemption.adapters import ParsedNotice, UnparseableNotice
from preemption.models import (
    LOSING_KINDS,
    Action,
    Kind,
    Mode,
    NoticeCount,
    PreemptionNotice,
    PreemptionPolicy,
    ShadowReclaim,
    Source,
    Via,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Policy:
    mode: str
    drain_on_rebalance: bool


@dataclass
class Outcome:
    notice: PreemptionNotice
    duplicate: bool

    @property
    def action(self) -> str:
        return self.notice.action


@dataclass
class Receipt:
    source: str
    mode: str
    outcomes: list[Outcome] = field(default_factory=list)


def policy_for(source: str) -> Policy:
    """The mode for a cloud: its admin override, else settings.PREEMPTION_MODE."""
    row = PreemptionPolicy.objects.filter(source=source).values_list("mode", "drain_on_rebalance").first()
    mode, drain = row if row else ("", False)
    return Policy(mode=mode or settings.PREEMPTION_MODE, drain_on_rebalance=drain)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def receive(
    *, source: str, document: Any, via: str = Via.WEBHOOK, node: Node | None = None, now: datetime | None = None
) -> Receipt:
    """Everything a webhook or an agent's notice does. Raises UnparseableNotice (400)."""
    now = now or timezone.now()
    policy = policy_for(source)
    receipt = Receipt(source=source, mode=policy.mode)
    if policy.mode == Mode.OFF:
        count_receipt(source=source, kind="", mode=Mode.OFF, action=Action.IGNORED)
        return receipt
    try:
        if _has_nul(document):
            # No cloud sends one, and PostgreSQL stores none (text, jsonb): refused before the database.
            raise UnparseableNotice("The document contains a NUL character.")
        if via == Via.AGENT:
            parsed = adapters.parse_agent(
                source, document, received_at=now, node_id=node.pk, instance_id=node.cloud_instance_id
            )
        else:
            parsed = adapters.parse_webhook(source, document, received_at=now)
    except UnparseableNotice:
        count_receipt(source=source, kind="", mode=policy.mode, action="invalid")
        raise
    if not parsed:
        count_receipt(source=source, kind="", mode=policy.mode, action=Action.IGNORED)
    for notice in parsed:
        receipt.outcomes.append(handle_notice(notice, policy=policy, via=via, now=now))
    return receipt


def matching_nodes(notice: ParsedNotice):
    """The node a notice is about, first: by node id (generic, agent), else by cloud instance id.

    Should two nodes claim one instance id (a node listed twice), the one on the
    notice's cloud and most recently seen comes first.
    """
    if notice.node_id is not None:
        return Node.objects.filter(pk=notice.node_id)
    ids = [i for i in notice.instance_ids if i]
    if not ids:
        return Node.objects.none()
    same_cloud = Case(When(cloud_lower=notice.source, then=Value(0)), default=Value(1), output_field=IntegerField())
    return (
        Node.objects.filter(cloud_instance_id__in=ids)
        .annotate(cloud_lower=Lower("cloud"))
        .order_by(same_cloud, F("last_seen_at").desc(nulls_last=True), "-pk")
    )


def handle_notice(notice: ParsedNotice, *, policy: Policy, via: str, now: datetime) -> Outcome:
    with transaction.atomic():
        # Matched and locked in one statement: the notice's first step is already in line behind any other.
        node = matching_nodes(notice).select_for_update(of=("self",)).first()
        outcome = _handle_locked(notice, node=node, policy=policy, via=via, now=now)
    # Counted after the commit, in a statement of its own: a burst of notices for
    # many nodes must not queue on one counter row while each drains its node.
    row = outcome.notice
    count_receipt(source=row.source, kind=row.kind, mode=row.mode, action=row.action)
    log.info(
        "preemption_notice source=%s kind=%s node=%s mode=%s action=%s duplicate=%s",
        row.source, row.kind, row.node_id, row.mode, row.action, outcome.duplicate,
    )
    return outcome


def _handle_locked(notice: ParsedNotice, *, node: Node | None, policy: Policy, via: str, now: datetime) -> Outcome:
    existing = PreemptionNotice.objects.filter(source=notice.source, external_id=notice.external_id).first()
    if existing is not None:
        return _redelivered(existing)
    row = PreemptionNotice(
        source=notice.source,
        external_id=notice.external_id,
        via=via,
        kind=notice.kind,
        instance_id=notice.instance_id[:255],
        node=node,
        not_before=notice.not_before,
        received_at=now,
        mode=policy.mode,
        action=Action.NO_NODE,
        incarnation=notice.incarnation,
        document=notice.document,
    )
    if node is None:
        try:
            with transaction.atomic():
                row.save()
        except IntegrityError:
            # The same notice, unmatched, arriving twice at once: the other one has it.
            existing = PreemptionNotice.objects.filter(source=notice.source, external_id=notice.external_id).first()
            if existing is None:
                raise
            return _redelivered(existing)
        return Outcome(notice=row, duplicate=False)
    if policy.mode == Mode.PROD:
        row.duplicate = _prod(row, node, policy=policy, now=now)
    else:
        row.duplicate = _shadow(row, node, policy=policy, now=now)
    # Saved once it is known what it did. Under the node's lock no other transaction can
    # be inserting it meanwhile: the same notice always matches the same node.
    row.save()
    return Outcome(notice=row, duplicate=row.duplicate)


def _redelivered(existing: PreemptionNotice) -> Outcome:
    return Outcome(notice=existing, duplicate=True)


def _is_stale(row: PreemptionNotice, node: Node) -> bool:
    """An Azure document older than one already read for this node: its state never moves back."""
    if row.source != Source.AZURE or row.incarnation is None:
        return False
    newest = (
        PreemptionNotice.objects.filter(node=node, source=Source.AZURE, incarnation__isnull=False)
        .aggregate(m=Max("incarnation"))["m"]
    )
    return newest is not None and row.incarnation < newest


def _prod(row: PreemptionNotice, node: Node, *, policy: Policy, now: datetime) -> bool:
    """Act on a locked node; returns True when nothing new happened."""
    if not node.workload_enabled:
        # Reclaimed already (by a notice, a Pause, ...): only an earlier deadline is news.
        row.action = Action.RECLAIMED
        if row.kind in LOSING_KINDS and row.not_before is not None and not _is_stale(row, node):
            if has_later_deadlines(node=node, not_before=row.not_before, now=now):
                _, row.reclaim = reclaim_node(
                    node_id=node.pk, trigger=ReclaimTrigger.PREEMPTION, now=now, not_before=row.not_before
                )
                return False
        row.reclaim = latest_reclaim(node)
        return True
    if _is_stale(row, node):
        row.action = Action.IGNORED
        return True
    if row.kind == Kind.REBALANCE:
        until = now + timedelta(seconds=settings.PREEMPTION_AT_RISK_S)
        marked = mark_node_at_risk(node_id=node.pk, until=until, now=now)
        node.refresh_from_db(fields=["at_risk_until"])
        row.at_risk_until = node.at_risk_until
        if not policy.drain_on_rebalance:
            row.action = Action.IGNORED
            return not marked
    _, row.reclaim = reclaim_node(
        node_id=node.pk, trigger=ReclaimTrigger.PREEMPTION, now=now, not_before=row.not_before
    )
    row.action = Action.RECLAIMED
    return False


def _shadow(row: PreemptionNotice, node: Node, *, policy: Policy, now: datetime) -> bool:
    """Record what prod would do; touch nothing that routes. True when nothing new was recorded."""
    if _is_stale(row, node):
        row.action = Action.IGNORED
        return True
    if row.kind == Kind.REBALANCE and not policy.drain_on_rebalance:
        # Prod would mark the node at risk; shadow only says until when.
        row.action = Action.IGNORED
        row.at_risk_until = now + timedelta(seconds=settings.PREEMPTION_AT_RISK_S)
        return PreemptionNotice.objects.filter(
            node=node, kind=Kind.REBALANCE, mode=Mode.SHADOW, at_risk_until__gt=now
        ).exists()
    row.action = Action.WOULD_RECLAIM_SPOT
    deadline = drain_deadline(now, row.not_before)
    window = timedelta(seconds=settings.DRAIN_CEILING_S)
    open_shadow = (
        ShadowReclaim.objects.select_for_update().filter(node=node, started_at__gt=now - window).order_by("-started_at").first()
    )
    if open_shadow is None:
        prediction = predict_drain(node=node, started_at=now, deadline=deadline, not_before=row.not_before, now=now)
        row.shadow_reclaim = ShadowReclaim.objects.create(node=node, started_at=now, **prediction)
        return False
    row.shadow_reclaim = open_shadow
    if deadline >= open_shadow.deadline:
        return True
    prediction = predict_drain(
        node=node, started_at=open_shadow.started_at, deadline=deadline, not_before=row.not_before, now=now
    )
    for name, value in prediction.items():
        setattr(open_shadow, name, value)
    open_shadow.save(update_fields=list(prediction))
    return False


def predict_drain(
    *, node: Node, started_at: datetime, deadline: datetime, not_before: datetime | None, now: datetime
) -> dict[str, Any]:
    """The timeline prod would run: requests in flight now, when each would finish from its
    age and the model's tokens/s, how many the deadline would cut, the rentals noticed.

    A request's expected end assumes a typical answer (PREEMPTION_TYPICAL_OUTPUT_TOKENS
    at the model's typical tokens/s); its latest end, the router's cap on a spot
    worker (SPOT_GENERATION_WINDOW_S of generation). One that outlives its
    expected end is expected to end now.
    """
    from rentals.models import Rental, RentalStatus

    workers = list(
        Worker.objects.filter(node=node, status__in=SERVING_WORKER_STATUSES).select_related("model").order_by("created_at")
    )
    slots: dict[Any, list[tuple[str, datetime]]] = {}
    for worker_id, request_id, acquired_at in Slot.objects.filter(worker__in=workers).values_list(
        "worker_id", "request_id", "acquired_at"
    ).order_by("acquired_at"):
        slots.setdefault(worker_id, []).append((request_id, acquired_at))
    window = timedelta(seconds=settings.SPOT_GENERATION_WINDOW_S)
    would_cut = may_cut = in_flight = 0
    timeline = []
    for worker in workers:
        tokens_per_s = max(worker.model.typical_tokens_per_s, 0.001)
        typical = timedelta(seconds=settings.PREEMPTION_TYPICAL_OUTPUT_TOKENS / tokens_per_s)
        requests = []
        for request_id, acquired_at in slots.get(worker.pk, []):
            expected = max(acquired_at + typical, now)
            latest = max(acquired_at + window, now)
            cut, maybe = expected > deadline, latest > deadline
            would_cut += cut
            may_cut += maybe
            requests.append(
                {
                    "request_id": request_id,
                    "admitted_at": acquired_at.isoformat(),
                    "age_s": round((now - acquired_at).total_seconds(), 3),
                    "expected_end": expected.isoformat(),
                    "latest_end": latest.isoformat(),
                    "would_cut": cut,
                    "may_cut": maybe,
                }
            )
        in_flight += worker.in_flight
        ends = [datetime.fromisoformat(r["expected_end"]) for r in requests]
        stop_at = min(max(ends), deadline) if ends else now
        timeline.append(
            {
                "worker_id": str(worker.pk),
                "model": worker.model.name,
                "status": worker.status,
                "in_flight": worker.in_flight,
                "tokens_per_s": worker.model.typical_tokens_per_s,
                "expected_stop": stop_at.isoformat(),
                "requests": requests,
            }
        )
    rental_at = now + timedelta(seconds=settings.RENTAL_NOTICE_S)
    if not_before is not None:
        rental_at = max(min(rental_at, not_before - timedelta(seconds=settings.NOTICE_MARGIN_S)), now)
    rentals = [
        {"rental_id": pk, "reclaim_at": (min(at, rental_at) if at else rental_at).isoformat()}
        for pk, at in Rental.objects.filter(
            node=node, status__in=[RentalStatus.ACTIVE, RentalStatus.RECLAIMING]
        ).values_list("pk", "reclaim_at")
    ]
    return {
        "not_before": not_before,
        "deadline": deadline,
        "in_flight_at_start": in_flight,
        "would_cut": would_cut,
        "may_cut": may_cut,
        "rentals_noticed": len(rentals),
        "predicted": {
            "started_at": started_at.isoformat(),
            "predicted_at": now.isoformat(),
            "not_before": not_before.isoformat() if not_before else None,
            "deadline": deadline.isoformat(),
            "in_flight": in_flight,
            "would_cut": would_cut,
            "may_cut": may_cut,
            "workers": timeline,
            "rentals": rentals,
            "assumptions": {
                "typical_output_tokens": settings.PREEMPTION_TYPICAL_OUTPUT_TOKENS,
                "spot_generation_window_s": settings.SPOT_GENERATION_WINDOW_S,
                "margin_s": settings.NOTICE_MARGIN_S,
                "ceiling_s": settings.DRAIN_CEILING_S,
            },
        },
    }


# --- counters (R15) ------------------------------------------------------------------------


def count_receipt(*, source: str, kind: str, mode: str, action: str) -> None:
    """Count one receipt. Called outside the notice's transaction (see handle_notice)."""
    labels = {"source": source, "kind": kind, "mode": mode, "action": action}
    try:
        if NoticeCount.objects.filter(**labels).update(count=F("count") + 1):
            return
        try:
            with transaction.atomic():
                NoticeCount.objects.create(count=1, **labels)
        except IntegrityError:
            NoticeCount.objects.filter(**labels).update(count=F("count") + 1)
    except Exception:  # a counter must never fail the notice it counts
        log.exception("preemption counter %s not incremented", labels)
