"""R5: draining, zero slots or the deadline, then stopped; the event path and the tick backstop."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from nodes.drain import drain_deadline, finish_drain
from nodes.models import Command, Reclaim, Slot, Worker, WorkerStatus
from nodes.recovery import drain_tick
from nodes.services import pause_node
from nodes.slots import acquire_slot, release_slot, router_heartbeat
from tests.factories import make_node, make_ready_worker

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def paused_with_slots(owner, model, slots: int):
    with time_machine.travel(T0, tick=False):
        node, _ = make_node(provider=owner, is_spot=True)
        worker = make_ready_worker(node, model=model)
        router_heartbeat(instance_id="router-1")
        held = [acquire_slot(worker_id=worker.pk, router_instance="router-1") for _ in range(slots)]
        assert all(held)
        _, reclaim = pause_node(node_id=node.pk)
    return node, worker, reclaim, held


def test_r5_deadline_is_min_of_ceiling_and_notice_minus_margin():
    assert drain_deadline(T0) == T0 + timedelta(seconds=120)
    assert drain_deadline(T0, not_before=T0 + timedelta(seconds=30)) == T0 + timedelta(seconds=20)
    assert drain_deadline(T0, not_before=T0 + timedelta(seconds=500)) == T0 + timedelta(seconds=120)
    assert drain_deadline(T0, not_before=T0 - timedelta(seconds=5)) == T0  # never before the start


def test_r5_draining_worker_admits_no_new_request(owner, model):
    _, worker, _, _ = paused_with_slots(owner, model, slots=1)
    assert acquire_slot(worker_id=worker.pk, router_instance="router-1", now=T0) is None
    worker.refresh_from_db()
    assert worker.in_flight == 1


def test_r5_finish_waits_while_slots_are_held_before_the_deadline(owner, model):
    _, worker, _, _ = paused_with_slots(owner, model, slots=2)
    assert finish_drain(worker.pk, now=T0 + timedelta(seconds=60)) is False
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING


def test_r5_finish_at_zero_slots_stops_as_drained(owner, model, django_capture_on_commit_callbacks):
    _, worker, reclaim, held = paused_with_slots(owner, model, slots=2)
    release_slot(slot_id=held[0].pk, worker_id=worker.pk)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING
    # The last release finishes the drain on commit, not at the next tick.
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        release_slot(slot_id=held[1].pk, worker_id=worker.pk)
    assert len(callbacks) == 1
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED and worker.stop_reason == "drained" and worker.requests_cut == 0
    reclaim.refresh_from_db()
    assert (reclaim.in_flight_at_start, reclaim.completed, reclaim.cut) == (2, 2, 0)
    assert reclaim.finished_at is not None
    assert Command.objects.get(kind="stop_worker").payload["reason"] == "drained"


def test_r5_finish_at_deadline_with_slots_held_stops_as_ceiling_and_counts_cut(owner, model):
    _, worker, reclaim, _ = paused_with_slots(owner, model, slots=3)
    with time_machine.travel(T0 + timedelta(seconds=119), tick=False):
        assert drain_tick() == 0
    with time_machine.travel(T0 + timedelta(seconds=120), tick=False):
        assert drain_tick() == 1
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED
    assert worker.stop_reason == "ceiling" and worker.requests_cut == 3
    assert not Slot.objects.filter(worker=worker).exists()
    stop = Command.objects.get(kind="stop_worker", worker=worker)
    assert stop.payload["reason"] == "ceiling"
    reclaim.refresh_from_db()
    assert (reclaim.completed, reclaim.cut) == (0, 3)
    assert reclaim.finished_at == T0 + timedelta(seconds=120)


def test_r5_finish_twice_stops_once(owner, model):
    _, worker, _, _ = paused_with_slots(owner, model, slots=1)
    later = T0 + timedelta(seconds=121)
    assert finish_drain(worker.pk, now=later) is True
    assert finish_drain(worker.pk, now=later) is False
    assert Command.objects.filter(kind="stop_worker").count() == 1


def test_r5_release_after_cut_is_harmless(owner, model):
    _, worker, _, held = paused_with_slots(owner, model, slots=1)
    finish_drain(worker.pk, now=T0 + timedelta(seconds=121))
    assert release_slot(slot_id=held[0].pk, worker_id=worker.pk) is False
    worker.refresh_from_db()
    assert worker.in_flight == 0


def test_r5_reclaims_api_reads_back_the_timeline(owner, model, owner_api):
    node, worker, reclaim, held = paused_with_slots(owner, model, slots=1)
    release_slot(slot_id=held[0].pk, worker_id=worker.pk)
    finish_drain(worker.pk, now=T0 + timedelta(seconds=5))
    body = owner_api.get(f"/api/v1/nodes/{node.pk}/reclaims").json()
    assert len(body) == 1
    item = body[0]
    assert item["id"] == reclaim.pk and item["trigger"] == "owner_pause"
    assert item["in_flight_at_start"] == 1 and item["completed"] == 1 and item["cut"] == 0
    assert item["workers"] == [
        {
            "id": str(worker.pk),
            "stop_reason": "drained",
            "stopped_at": "2026-11-30T12:00:05Z",
            "drain_started_at": "2026-11-30T12:00:00Z",
            "in_flight_at_drain": 1,
            "requests_cut": 0,
        }
    ]
    kinds = [e["kind"] for e in item["timeline"]]
    assert kinds[:2] == ["worker_draining", "drain_started"]
    assert "worker_stopped" in kinds and kinds[-1] == "reclaim_finished"


def test_r5_tick_finishes_idle_drains_when_the_event_was_lost(owner, model):
    # The on_commit task never ran (no capture): the tick is the backstop.
    _, worker, _, _ = paused_with_slots(owner, model, slots=0)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING
    assert drain_tick() == 1
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED
    assert Reclaim.objects.get().finished_at is not None
