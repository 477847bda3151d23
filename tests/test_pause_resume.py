"""R1, R2: one flag; Pause drains and notices in one transaction; Available undoes what it can."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.utils import timezone

from nodes.models import Command, Node, Reclaim, Worker, WorkerStatus
from nodes.services import pause_node, resume_node
from nodes.slots import acquire_slot, router_heartbeat
from rentals.models import Rental, RentalStatus
from rentals.services import start_rental
from tests.factories import make_node, make_ready_worker

pytestmark = pytest.mark.django_db


def test_r1_new_node_has_workload_enabled(owner):
    node, _ = make_node(provider=owner, is_spot=True)
    assert node.workload_enabled is True


def test_r2_pause_disables_workload_drains_workers_and_notices_rentals(owner, renter, model, owner_api):
    node, _ = make_node(provider=owner, is_spot=True)
    rented_node, _ = make_node(provider=owner, is_spot=True)
    worker = make_ready_worker(node, model=model)
    router_heartbeat(instance_id="r1")
    assert acquire_slot(worker_id=worker.pk, router_instance="r1") is not None
    rental = start_rental(renter=renter, node_id=rented_node.pk)

    with time_machine.travel("2026-11-30 12:00:00Z", tick=False):
        response = owner_api.post(f"/api/v1/nodes/{node.pk}/pause")
        rented_response = owner_api.post(f"/api/v1/nodes/{rented_node.pk}/pause")
    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)

    assert response.status_code == 202
    body = response.json()
    assert body["state"] == "draining"
    assert body["workload_enabled"] is False
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING
    assert worker.drain_deadline == now + timedelta(seconds=120)
    reclaim = Reclaim.objects.get(pk=body["reclaim"]["id"])
    assert reclaim.trigger == "owner_pause" and reclaim.in_flight_at_start == 1
    assert body["reclaim"]["deadline"] == "2026-11-30T12:02:00Z"

    assert rented_response.status_code == 202
    rental.refresh_from_db()
    assert rental.status == RentalStatus.RECLAIMING
    assert rental.reclaim_at == now + timedelta(seconds=120)


def test_r2_pause_is_atomic_when_the_rental_notice_fails(owner, renter, model, monkeypatch):
    node, _ = make_node(provider=owner, is_spot=True)
    worker = make_ready_worker(node, model=model)

    def boom(**kwargs):
        raise RuntimeError("notice failed")

    monkeypatch.setattr("rentals.services.schedule_rental_reclaims", boom)
    with pytest.raises(RuntimeError):
        pause_node(node_id=node.pk)
    node.refresh_from_db()
    worker.refresh_from_db()
    assert node.workload_enabled is True
    assert worker.status == WorkerStatus.READY
    assert not Reclaim.objects.exists()


def test_r2_pause_is_idempotent(owner, model, owner_api):
    node, _ = make_node(provider=owner, is_spot=True)
    make_ready_worker(node, model=model)
    first = owner_api.post(f"/api/v1/nodes/{node.pk}/pause").json()
    second = owner_api.post(f"/api/v1/nodes/{node.pk}/pause")
    assert second.status_code == 202
    assert second.json()["reclaim"] == first["reclaim"]
    assert Reclaim.objects.filter(node=node).count() == 1


def test_r2_pause_on_non_spot_node_is_409_not_spot(owner, model, owner_api):
    node, _ = make_node(provider=owner, is_spot=False)
    worker = make_ready_worker(node, model=model)
    response = owner_api.post(f"/api/v1/nodes/{node.pk}/pause")
    assert response.status_code == 409
    assert response.json()["code"] == "not_spot"
    node.refresh_from_db()
    worker.refresh_from_db()
    assert node.workload_enabled and worker.status == WorkerStatus.READY


def test_r2_pause_with_nothing_to_drain_is_paused_and_reclaim_finished(owner, owner_api):
    node, _ = make_node(provider=owner, is_spot=True)
    body = owner_api.post(f"/api/v1/nodes/{node.pk}/pause").json()
    assert body["state"] == "paused"
    assert Reclaim.objects.get(pk=body["reclaim"]["id"]).finished_at is not None


def test_r2_idle_worker_stops_right_after_the_pause_commits(owner, model, django_capture_on_commit_callbacks):
    node, _ = make_node(provider=owner, is_spot=True)
    worker = make_ready_worker(node, model=model)
    with django_capture_on_commit_callbacks(execute=True):
        pause_node(node_id=node.pk)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED and worker.stop_reason == "drained"
    stop = Command.objects.get(worker=worker, kind="stop_worker")
    assert stop.payload["reason"] == "drained"


def test_r2_resume_enables_workload_and_places_a_worker(owner, model, owner_api, django_capture_on_commit_callbacks):
    node, _ = make_node(provider=owner, is_spot=True)
    with django_capture_on_commit_callbacks(execute=True):
        owner_api.post(f"/api/v1/nodes/{node.pk}/pause")
    response = owner_api.post(f"/api/v1/nodes/{node.pk}/resume")
    assert response.status_code == 200
    assert response.json()["state"] == "available"
    assert response.json()["workload_enabled"] is True
    started = Worker.objects.get(node=node, status=WorkerStatus.STARTING)
    assert Command.objects.filter(kind="start_worker", worker=started).count() == 1
    # Idempotent: a second Available places nothing more.
    assert owner_api.post(f"/api/v1/nodes/{node.pk}/resume").status_code == 200
    assert Worker.objects.filter(node=node).exclude(status="stopped").count() == 1


def test_r2_resume_lets_running_drain_finish_before_placing(owner, model):
    node, _ = make_node(provider=owner, is_spot=True)
    worker = make_ready_worker(node, model=model)
    router_heartbeat(instance_id="r1")
    slot = acquire_slot(worker_id=worker.pk, router_instance="r1")
    pause_node(node_id=node.pk)
    resume_node(node_id=node.pk)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING  # a drain, once begun, always ends by stopping
    assert not Worker.objects.filter(node=node, status=WorkerStatus.STARTING).exists()

    from nodes.slots import release_slot

    release_slot(slot_id=slot.pk, worker_id=worker.pk)
    from nodes.drain import finish_drain

    assert finish_drain(worker.pk) is True
    assert Worker.objects.filter(node=node, status=WorkerStatus.STARTING).count() == 1


def test_r2_resume_cancels_pending_rental_reclaims_and_notice_404s_again(owner, renter, renter_api, owner_api):
    node, _ = make_node(provider=owner, is_spot=True)
    rental = start_rental(renter=renter, node_id=node.pk)
    notice = renter_api.get(f"/api/v1/rentals/{rental.pk}").json()["notice_url"]
    owner_api.post(f"/api/v1/nodes/{node.pk}/pause")
    assert renter_api.get(notice).status_code == 200
    owner_api.post(f"/api/v1/nodes/{node.pk}/resume")
    rental.refresh_from_db()
    assert rental.status == RentalStatus.ACTIVE and rental.reclaim_at is None
    assert renter_api.get(notice).status_code == 404


def test_r2_rental_reclaim_is_carried_out_at_reclaim_at(owner, renter, owner_api):
    from rentals.services import carry_out_due_rentals

    node, _ = make_node(provider=owner, is_spot=True)
    rental = start_rental(renter=renter, node_id=node.pk)
    with time_machine.travel("2026-11-30 12:00:00Z", tick=False):
        owner_api.post(f"/api/v1/nodes/{node.pk}/pause")
    with time_machine.travel("2026-11-30 12:01:59Z", tick=False):
        assert carry_out_due_rentals() == {"reclaimed": 0, "term": 0}
    with time_machine.travel("2026-11-30 12:02:00Z", tick=False):
        assert carry_out_due_rentals() == {"reclaimed": 1, "term": 0}
        assert carry_out_due_rentals() == {"reclaimed": 0, "term": 0}
    rental.refresh_from_db()
    assert rental.status == RentalStatus.ENDED and rental.end_reason == "spot_reclaim"
    stop = Command.objects.get(node=node, kind="stop_rental")
    assert stop.payload == {"rental_id": rental.pk, "at": "2026-11-30T12:02:00+00:00"}
    reclaim = Reclaim.objects.get(node=node)
    assert reclaim.finished_at is not None and reclaim.rentals_noticed == 1


def test_r2_rental_start_drains_inference_workers_first(owner, renter, model, django_capture_on_commit_callbacks):
    node, _ = make_node(provider=owner, is_spot=False)
    worker = make_ready_worker(node, model=model)
    router_heartbeat(instance_id="r1")
    slot = acquire_slot(worker_id=worker.pk, router_instance="r1")
    rental = start_rental(renter=renter, node_id=node.pk)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING
    assert Reclaim.objects.get(node=node).trigger == "rental_start"
    assert not Command.objects.filter(kind="start_rental").exists()

    from nodes.slots import release_slot

    with django_capture_on_commit_callbacks(execute=True):
        release_slot(slot_id=slot.pk, worker_id=worker.pk)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED
    start = Command.objects.get(kind="start_rental")
    assert start.payload == {"rental_id": rental.pk}
    assert not Worker.objects.filter(node=node, status__in=["starting", "ready"]).exists()


def test_r2_node_state_reads_back_as_the_owner_sees_it(owner, model, owner_api):
    node, _ = make_node(provider=owner, is_spot=True)
    offline, _ = make_node(provider=owner, is_spot=True, online=False)
    states = {n["id"]: n["state"] for n in owner_api.get("/api/v1/nodes").json()}
    assert states == {node.pk: "available", offline.pk: "offline"}
    Node.objects.filter(pk=node.pk).update(workload_enabled=False)
    assert owner_api.get(f"/api/v1/nodes/{node.pk}").json()["state"] == "paused"
