"""R8: one recovery run finishes what a crash or a lost message left half done."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from nodes.models import Command, Node, Reclaim, Worker, WorkerStatus
from nodes.recovery import run_recovery
from nodes.services import pause_node
from nodes.slots import acquire_slot, release_dead_router_slots, router_heartbeat
from rentals.models import RentalStatus
from rentals.services import start_rental
from tests.factories import make_node, make_ready_worker

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def test_r8_recovery_finishes_a_drain_killed_half_way(owner, model):
    with time_machine.travel(T0, tick=False):
        node, _ = make_node(provider=owner, is_spot=True)
        worker = make_ready_worker(node, model=model)
        router_heartbeat(instance_id="r1")
        acquire_slot(worker_id=worker.pk, router_instance="r1")
        pause_node(node_id=node.pk)  # the process dies here: no finish ever ran
    with time_machine.travel(T0 + timedelta(seconds=60), tick=False):
        router_heartbeat(instance_id="r1")
        run_recovery()
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING  # still within its deadline, slot held
    with time_machine.travel(T0 + timedelta(seconds=121), tick=False):
        report = run_recovery()
    assert report["drains_finished"] == 1
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED and worker.stop_reason == "ceiling"
    assert worker.drain_deadline == T0 + timedelta(seconds=120)  # the stored deadline never moved
    assert Command.objects.filter(kind="stop_worker", worker=worker).count() == 1
    with time_machine.travel(T0 + timedelta(seconds=122), tick=False):
        run_recovery()
    assert Command.objects.filter(kind="stop_worker", worker=worker).count() == 1


def test_r8_recovery_drains_a_disabled_node_that_still_has_a_ready_worker(owner, model):
    node, _ = make_node(provider=owner, is_spot=True)
    worker = make_ready_worker(node, model=model)
    # Workload turned off without the drain (e.g. a crash between two steps of an old version).
    Node.objects.filter(pk=node.pk).update(workload_enabled=False)
    report = run_recovery()
    assert report["drains_started"] == 1
    worker.refresh_from_db()
    assert worker.status in (WorkerStatus.DRAINING, WorkerStatus.STOPPED)
    assert Reclaim.objects.get(node=node).trigger == "recovery"
    assert run_recovery()["drains_started"] == 0


def test_r8_recovery_places_a_missing_worker_on_an_idle_enabled_node(owner, model):
    node, _ = make_node(provider=owner)
    assert run_recovery()["placed"] == 1
    assert Worker.objects.get(node=node).status == WorkerStatus.STARTING
    assert run_recovery()["placed"] == 0


def test_r8_recovery_marks_expired_workers_lost_and_replaces_them(owner, model):
    with time_machine.travel(T0, tick=False):
        node, _ = make_node(provider=owner)
        worker = make_ready_worker(node, model=model)
    with time_machine.travel(T0 + timedelta(seconds=29), tick=False):
        Node.objects.filter(pk=node.pk).update(last_seen_at=T0 + timedelta(seconds=29))
    with time_machine.travel(T0 + timedelta(seconds=31), tick=False):
        report = run_recovery()
    assert report["expired"]["lost"] == 1
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.LOST
    # The node still heartbeats, so its lost worker is replaced in the same run.
    assert Worker.objects.filter(node=node, status=WorkerStatus.STARTING).count() == 1


def test_r8_recovery_carries_out_due_rental_reclaims(owner, renter):
    with time_machine.travel(T0, tick=False):
        node, _ = make_node(provider=owner, is_spot=True)
        rental = start_rental(renter=renter, node_id=node.pk)
        pause_node(node_id=node.pk)
    with time_machine.travel(T0 + timedelta(seconds=121), tick=False):
        report = run_recovery()
    assert report["rentals"]["reclaimed"] == 1
    rental.refresh_from_db()
    assert rental.status == RentalStatus.ENDED


def test_r8_dead_router_slots_are_released_and_finish_the_drain(owner, model, django_capture_on_commit_callbacks):
    with time_machine.travel(T0, tick=False):
        node, _ = make_node(provider=owner, is_spot=True)
        worker = make_ready_worker(node, model=model)
        router_heartbeat(instance_id="dead-router")
        router_heartbeat(instance_id="live-router")
        acquire_slot(worker_id=worker.pk, router_instance="dead-router")
        pause_node(node_id=node.pk)
    with time_machine.travel(T0 + timedelta(seconds=20), tick=False):
        router_heartbeat(instance_id="live-router")
        with django_capture_on_commit_callbacks(execute=True):
            assert release_dead_router_slots() == 1
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED and worker.stop_reason == "drained"


def test_r8_every_task_run_twice_ends_in_the_same_state(owner, renter, model):
    from nodes.tasks import drain_tick, finish_drain_task, heartbeat_guard, recovery_task
    from rentals.tasks import rental_tick

    with time_machine.travel(T0, tick=False):
        node, _ = make_node(provider=owner, is_spot=True)
        worker = make_ready_worker(node, model=model)
        router_heartbeat(instance_id="r1")
        acquire_slot(worker_id=worker.pk, router_instance="r1")
        other, _ = make_node(provider=owner, is_spot=True)
        start_rental(renter=renter, node_id=other.pk)
        pause_node(node_id=node.pk)
        pause_node(node_id=other.pk)

    def snapshot():
        return (
            sorted(Worker.objects.values_list("pk", "status", "stop_reason", "in_flight")),
            sorted(Command.objects.values_list("kind", "worker_id")),
            sorted(Reclaim.objects.values_list("pk", "finished_at", "completed", "cut")),
        )

    with time_machine.travel(T0 + timedelta(seconds=125), tick=False):
        for task in (drain_tick, rental_tick, heartbeat_guard, recovery_task):
            task.apply()
        finish_drain_task.apply(args=[str(worker.pk)])
        once = snapshot()
        for task in (drain_tick, rental_tick, heartbeat_guard, recovery_task):
            task.apply()
        finish_drain_task.apply(args=[str(worker.pk)])
        assert snapshot() == once
