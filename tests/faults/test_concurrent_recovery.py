"""Fault: two (four) beat schedulers at once. Every drain, rental reclaim and expiry is done once.

In-process on PostgreSQL: threads run nodes.recovery.run_recovery, drain_tick
and the heartbeat guard (nodes.tasks.heartbeat_guard's body) at the same time,
all with one fixed `now` past every deadline, over many due rows. Row locks and
conditional updates must make each transition happen exactly once.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from nodes import heartbeats, recovery, slots
from nodes.models import Command, Node, NodeEvent, RouterInstance, Worker, WorkerStatus
from nodes.services import pause_node
from rentals.models import Rental, RentalStatus
from rentals.services import start_rental
from tests.factories import UserFactory, make_node, make_ready_worker
from tests.test_races import run_threads

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ROUNDS = 3
DRAINS, RENTALS, EXPIRED, HEALTHY = 12, 8, 5, 20
RUNNERS = 6  # 2 x (run_recovery, drain_tick, heartbeat_guard)


def test_fault_concurrent_recovery_runs_process_every_due_row_once(owner, model, fault_report):
    renter = UserFactory()
    far = timezone.now() + timedelta(days=1)
    # A router that keeps beating: held slots stay held, so drains end at their deadline.
    RouterInstance.objects.create(id="r-faults", started_at=timezone.now(), last_beat_at=far)
    totals = Counter()
    started = time.monotonic()
    for round_ in range(ROUNDS):
        drained = []
        for _ in range(DRAINS):
            node, _ = make_node(provider=owner, is_spot=True)
            worker = make_ready_worker(node, model=model)
            slots.acquire_slot(worker_id=worker.pk, router_instance="r-faults")
            drained.append(worker.pk)
        rented = []
        for _ in range(RENTALS):
            node, _ = make_node(provider=owner, is_spot=True)
            rented.append(start_rental(renter=renter, node_id=node.pk).pk)
        expired = []
        for _ in range(EXPIRED):
            node, _ = make_node(provider=owner)
            expired.append(make_ready_worker(node, model=model).pk)
        healthy = []
        for _ in range(HEALTHY):
            node, _ = make_node(provider=owner)
            healthy.append(make_ready_worker(node, model=model).pk)
        for worker_id in drained:
            pause_node(node_id=Worker.objects.get(pk=worker_id).node_id)
        for rental in Rental.objects.filter(pk__in=rented):
            pause_node(node_id=rental.node_id)
        assert Worker.objects.filter(pk__in=drained, status=WorkerStatus.DRAINING).count() == DRAINS
        assert Rental.objects.filter(pk__in=rented, status=RentalStatus.RECLAIMING).count() == RENTALS
        deadlines = dict(Worker.objects.filter(pk__in=drained).values_list("pk", "drain_deadline"))

        # One instant past every drain deadline and rental notice; the expired
        # set is silent past its expiry, the healthy fleet is not.
        now = max([*deadlines.values(), *Rental.objects.filter(pk__in=rented).values_list("reclaim_at", flat=True)])
        now += timedelta(seconds=1)
        Worker.objects.filter(pk__in=healthy + drained).update(expires_at=now + timedelta(hours=1))
        Worker.objects.filter(pk__in=expired).update(expires_at=now - timedelta(seconds=1))

        def guard() -> dict:
            released = slots.release_dead_router_slots(now=now)
            return {**heartbeats.expire_workers(now=now), "released": released}

        runners = [
            lambda: recovery.run_recovery(now=now),
            lambda: recovery.drain_tick(now=now),
            guard,
        ] * (RUNNERS // 3)
        results = run_threads(runners)
        errors = [r for r in results if isinstance(r, Exception)]
        assert errors == [], f"round {round_}: {errors!r}"

        # Every drain: stopped once at its ceiling, one stop command, deadline unmoved.
        rows = {w.pk: w for w in Worker.objects.filter(pk__in=drained)}
        assert {w.status for w in rows.values()} == {WorkerStatus.STOPPED}
        assert {w.stop_reason for w in rows.values()} == {"ceiling"}
        assert all(rows[pk].drain_deadline == deadlines[pk] for pk in drained), "a stored deadline moved"
        stops = Counter(Command.objects.filter(kind="stop_worker", worker_id__in=drained).values_list("worker_id", flat=True))
        assert stops == Counter({pk: 1 for pk in drained}), stops
        # Every rental reclaim: ended once, one stop_rental command.
        ended = Rental.objects.filter(pk__in=rented)
        assert {r.status for r in ended} == {RentalStatus.ENDED}
        assert {r.end_reason for r in ended} == {"spot_reclaim"}
        stop_rentals = Counter(
            c.payload["rental_id"] for c in Command.objects.filter(kind="stop_rental") if c.payload["rental_id"] in rented
        )
        assert stop_rentals == Counter({pk: 1 for pk in rented}), stop_rentals
        ended_events = Counter(
            e.data["rental_id"] for e in NodeEvent.objects.filter(kind="rental_ended") if e.data.get("rental_id") in rented
        )
        assert ended_events == Counter({pk: 1 for pk in rented})
        # Every expiry: lost once (one worker_stopped event each), the healthy fleet untouched.
        lost = Worker.objects.filter(pk__in=expired)
        assert {w.status for w in lost} == {WorkerStatus.LOST}
        stopped_events = Counter(
            NodeEvent.objects.filter(kind="worker_stopped", worker_id__in=drained + expired).values_list("worker_id", flat=True)
        )
        assert stopped_events == Counter({pk: 1 for pk in drained + expired}), stopped_events
        assert Worker.objects.filter(pk__in=healthy, status=WorkerStatus.READY).count() == HEALTHY
        # No node got two new workers from two placers (its agent is silent at `now`, so most get none).
        for node_id in Worker.objects.filter(pk__in=expired).values_list("node_id", flat=True):
            live = Worker.objects.filter(node_id=node_id, status__in=("starting", "ready", "draining")).count()
            assert live <= 1, f"node {node_id}: {live} live workers"
        assert Node.objects.filter(reclaims__finished_at__isnull=True, workload_enabled=False).count() == 0
        Worker.objects.filter(pk__in=healthy).update(status=WorkerStatus.STOPPED)  # out of the next round's fleet
        totals.update(drains=DRAINS, rentals=RENTALS, expiries=EXPIRED)
    elapsed = time.monotonic() - started
    trials = sum(totals.values())
    fault_report(
        f"fault: {RUNNERS} concurrent recovery/drain_tick/guard runs: {ROUNDS} rounds, {trials} trials "
        f"({totals['drains']} drains, {totals['rentals']} rental reclaims, {totals['expiries']} expiries), "
        f"each done exactly once, {elapsed:.1f} s"
    )
