"""R8: finish what a restart, a lost message or a dead process interrupted.

Everything here reads state from the database and calls the same transition
functions as the live path, each safe to run twice at once.
"""

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from nodes.drain import finish_drain, maybe_finish_reclaim, start_node_drain
from nodes.heartbeats import expire_workers
from nodes.models import (
    LIVE_WORKER_STATUSES,
    SERVING_WORKER_STATUSES,
    Node,
    Reclaim,
    ReclaimTrigger,
    Worker,
    WorkerStatus,
)
from nodes.placement import place_worker

log = logging.getLogger(__name__)

BATCH = 500


def drain_tick(*, now: datetime | None = None) -> int:
    """Finish every drain at zero slots or past its deadline (the event path's backstop)."""
    due_at = now or timezone.now()
    due = Worker.objects.filter(status=WorkerStatus.DRAINING).filter(Q(in_flight=0) | Q(drain_deadline__lte=due_at))
    finished = 0
    for worker_id in list(due.order_by("drain_deadline").values_list("pk", flat=True)[:BATCH]):
        # Each stop reads its own clock (unless a test fixed it), so a long batch
        # records when each worker really stopped.
        finished += finish_drain(worker_id, now=now, skip_locked=True)
    return finished


def drain_disabled_nodes(*, now: datetime | None = None) -> int:
    """A node whose workload is off but still has a serving worker gets its drain started."""
    now = now or timezone.now()
    serving = Worker.objects.filter(node=OuterRef("pk"), status__in=SERVING_WORKER_STATUSES)
    node_ids = list(
        Node.objects.filter(workload_enabled=False).filter(Exists(serving)).values_list("pk", flat=True)[:BATCH]
    )
    started = 0
    for node_id in node_ids:
        with transaction.atomic():
            node = Node.objects.select_for_update(skip_locked=True).filter(pk=node_id, workload_enabled=False).first()
            if node is None or not Worker.objects.filter(node=node, status__in=SERVING_WORKER_STATUSES).exists():
                continue
            start_node_drain(node=node, trigger=ReclaimTrigger.RECOVERY, now=now)
            started += 1
    return started


def place_missing_workers(*, now: datetime | None = None) -> int:
    """An enabled, online, idle node missing its worker goes through R3."""
    from rentals.selectors import rented_q

    now = now or timezone.now()
    online_since = now - timedelta(seconds=settings.NODE_OFFLINE_S)
    live = Worker.objects.filter(node=OuterRef("pk"), status__in=LIVE_WORKER_STATUSES)
    node_ids = (
        Node.objects.filter(workload_enabled=True, last_seen_at__gte=online_since)
        .filter(~Exists(live))
        .exclude(rented_q())
        .values_list("pk", flat=True)[:BATCH]
    )
    return sum(1 for node_id in list(node_ids) if place_worker(node_id, now=now) is not None)


def close_finished_reclaims(*, now: datetime | None = None) -> int:
    now = now or timezone.now()
    ids = Reclaim.objects.filter(finished_at__isnull=True).values_list("pk", flat=True)[:BATCH]
    return sum(maybe_finish_reclaim(reclaim_id=pk, now=now) for pk in list(ids))


def run_recovery(*, now: datetime | None = None) -> dict[str, Any]:
    from rentals.services import carry_out_due_rentals, start_all_waiting_rentals

    now = now or timezone.now()
    report = {
        "drains_started": drain_disabled_nodes(now=now),
        "drains_finished": drain_tick(now=now),
        "rentals": carry_out_due_rentals(now=now),
        "rentals_started": start_all_waiting_rentals(now=now),
        "expired": expire_workers(now=now),
        "placed": place_missing_workers(now=now),
        "reclaims_closed": close_finished_reclaims(now=now),
    }
    if any(v for v in report.values() if isinstance(v, int)):
        log.info("recovery %s", report)
    return report
