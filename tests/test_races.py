"""Races on PostgreSQL with real threads: row locks and conditional updates hold."""

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections

from marketplace.errors import NodeRented, NodeUnavailable
from nodes.drain import finish_drain
from nodes.heartbeats import heartbeat
from nodes.models import Command, Node, Reclaim, Slot, Worker, WorkerStatus
from nodes.placement import place_worker
from nodes.services import pause_node, set_spot
from nodes.slots import acquire_slot, router_heartbeat
from rentals.models import Rental
from rentals.services import end_rental, start_rental
from tests.factories import UserFactory, make_node, make_ready_worker

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def run_threads(targets: list[Callable[[], Any]]) -> list[Any]:
    """Start every target at once (a barrier), join them, return results or exceptions."""
    barrier = threading.Barrier(len(targets))
    results: list[Any] = [None] * len(targets)

    def runner(i: int, fn: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[i] = fn()
        except Exception as exc:  # collected and asserted by the caller
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=runner, args=(i, fn)) for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_r10_spot_toggle_racing_rental_start_never_splits_the_flag(model):
    owner = UserFactory()
    renters = [UserFactory() for _ in range(25)]
    node, _ = make_node(provider=owner, is_spot=True)
    for round_ in range(4):
        node.refresh_from_db()
        start_flag = node.is_spot
        toggles = [
            (lambda v=(i % 2 == 0) != start_flag: set_spot(node_id=node.pk, is_spot=v)) for i in range(25)
        ]
        rentals = [(lambda r=r: start_rental(renter=r, node_id=node.pk)) for r in renters]
        interleaved = [fn for pair in zip(toggles, rentals) for fn in pair]
        results = run_threads(interleaved)

        started = [r for r in results if isinstance(r, Rental)]
        assert len(started) == 1, results
        unexpected = [r for r in results if isinstance(r, Exception) and not isinstance(r, (NodeRented, NodeUnavailable))]
        assert unexpected == []
        rental = started[0]
        node.refresh_from_db()
        assert rental.is_spot == node.is_spot, f"round {round_}: rental {rental.is_spot} vs node {node.is_spot}"
        end_rental(rental_id=rental.pk, reason="renter")
    assert Rental.objects.filter(status="ended").count() == 4


@pytest.mark.parametrize("initial", [WorkerStatus.READY, WorkerStatus.STARTING])
def test_r7_twenty_heartbeats_racing_a_pause_never_leave_the_worker_ready(owner, model, initial):
    node, _ = make_node(provider=owner, is_spot=True)
    worker = make_ready_worker(node, model=model)
    router_heartbeat(instance_id="r1")
    acquire_slot(worker_id=worker.pk, router_instance="r1")  # keeps it draining, not stopped
    Worker.objects.filter(pk=worker.pk).update(status=initial)
    paused = threading.Event()
    seen_after_pause: list[str] = []

    def beater() -> None:
        for _ in range(15):
            began_after_pause = paused.is_set()
            reply = heartbeat(node=node, workers=[{"id": worker.pk, "status": "ready"}])
            if began_after_pause:
                seen_after_pause.append(reply["workers"][0]["status"])

    def pauser() -> None:
        pause_node(node_id=node.pk)
        paused.set()

    results = run_threads([beater] * 20 + [pauser])
    assert [r for r in results if isinstance(r, Exception)] == []
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING
    # Every heartbeat that began after the pause committed was answered "draining".
    assert seen_after_pause and set(seen_after_pause) == {"draining"}
    assert heartbeat(node=node, workers=[{"id": worker.pk, "status": "ready"}])["workers"][0]["status"] == "draining"


def test_r4_admissions_racing_a_pause_stop_at_its_commit(owner, model):
    node, _ = make_node(provider=owner, is_spot=True)
    worker = make_ready_worker(node, model=model, max_slots=1000)
    router_heartbeat(instance_id="r1")
    paused = threading.Event()
    after_pause: list[Any] = []

    def admitter() -> None:
        for _ in range(20):
            done_before = paused.is_set()
            slot = acquire_slot(worker_id=worker.pk, router_instance="r1")
            if done_before:
                after_pause.append(slot)

    def pauser() -> None:
        pause_node(node_id=node.pk)
        paused.set()

    results = run_threads([admitter] * 10 + [pauser])
    assert [r for r in results if isinstance(r, Exception)] == []
    assert all(slot is None for slot in after_pause)
    reclaim = Reclaim.objects.get(node=node)
    worker.refresh_from_db()
    # Every slot that exists was counted at the drain's start: none came in after.
    assert Slot.objects.filter(worker=worker).count() == worker.in_flight == reclaim.in_flight_at_start


def test_r5_concurrent_finishes_stop_once(owner, model):
    node, _ = make_node(provider=owner, is_spot=True)
    workers = [make_ready_worker(node, model=model) for _ in range(5)]
    router_heartbeat(instance_id="r1")
    for w in workers:
        acquire_slot(worker_id=w.pk, router_instance="r1")
    pause_node(node_id=node.pk)
    Worker.objects.filter(node=node).update(drain_deadline=Worker.objects.get(pk=workers[0].pk).drain_started_at)
    results = run_threads([(lambda w=w: finish_drain(w.pk)) for w in workers for _ in range(4)])
    assert [r for r in results if isinstance(r, Exception)] == []
    assert sum(1 for r in results if r is True) == 5
    assert Command.objects.filter(kind="stop_worker").count() == 5
    assert Reclaim.objects.get(node=node).finished_at is not None


def test_r3_concurrent_placements_start_one_worker(owner, model):
    node, _ = make_node(provider=owner)
    results = run_threads([(lambda: place_worker(node.pk)) for _ in range(10)])
    assert [r for r in results if isinstance(r, Exception)] == []
    assert Worker.objects.filter(node=node).count() == 1
    assert Command.objects.filter(kind="start_worker").count() == 1


def test_r2_concurrent_pauses_make_one_reclaim(owner, renter, model):
    node, _ = make_node(provider=owner, is_spot=True)
    make_ready_worker(node, model=model)
    results = run_threads([(lambda: pause_node(node_id=node.pk)) for _ in range(10)])
    assert [r for r in results if isinstance(r, Exception)] == []
    assert Reclaim.objects.filter(node=node).count() == 1
    assert len({r[1].pk for r in results}) == 1
    assert Node.objects.get(pk=node.pk).workload_enabled is False
    assert connection.vendor == "postgresql"
