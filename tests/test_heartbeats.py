"""R7 (heartbeats cannot undo a drain) and R9 (late registration on a paused node)."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from nodes.heartbeats import expire_workers
from nodes.models import Command, Node, Reclaim, Worker, WorkerStatus
from nodes.placement import place_worker
from nodes.services import pause_node
from nodes.slots import acquire_slot, router_heartbeat
from tests.conftest import agent_client
from tests.factories import make_node, make_ready_worker

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def beat(token, workers, at=None):
    body = {"workers": [{"id": str(w.pk), "status": status, "in_flight": 0} for w, status in workers]}
    if at is None:
        return agent_client(token).post("/api/v1/agent/heartbeat", body, format="json")
    with time_machine.travel(at, tick=False):
        return agent_client(token).post("/api/v1/agent/heartbeat", body, format="json")


def test_r7_heartbeat_moves_starting_to_ready(owner, model):
    node, token = make_node(provider=owner)
    worker = place_worker(node)
    reply = beat(token, [(worker, "starting")])
    assert reply.json()["workers"][0]["status"] == "starting"
    reply = beat(token, [(worker, "ready")])
    assert reply.status_code == 200
    assert reply.json()["workers"][0]["status"] == "ready"
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.READY


def test_r7_heartbeat_cannot_undo_draining(owner, model):
    with time_machine.travel(T0, tick=False):
        node, token = make_node(provider=owner, is_spot=True)
        worker = make_ready_worker(node, model=model)
        router_heartbeat(instance_id="r1")
        acquire_slot(worker_id=worker.pk, router_instance="r1")
        pause_node(node_id=node.pk)
    reply = beat(token, [(worker, "ready")], at=T0 + timedelta(seconds=10))
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING
    assert worker.expires_at == T0 + timedelta(seconds=40)  # the expiry is refreshed all the same
    assert reply.json()["workers"] == [{"id": str(worker.pk), "status": "draining", "expires_at": "2026-11-30T12:00:40Z"}]


def test_r7_heartbeat_cannot_undo_stopped(owner, model):
    node, token = make_node(provider=owner, is_spot=True)
    worker = make_ready_worker(node, model=model)
    Worker.objects.filter(pk=worker.pk).update(status=WorkerStatus.STOPPED, stop_reason="drained")
    reply = beat(token, [(worker, "ready")])
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED
    assert reply.json()["workers"][0]["status"] == "stopped"


def test_r7_heartbeat_reply_carries_pending_commands_until_acked(owner, model):
    node, token = make_node(provider=owner)
    worker = place_worker(node)
    first = beat(token, []).json()["commands"]
    second = beat(token, []).json()["commands"]
    assert first == second and [c["kind"] for c in first] == ["start_worker"]
    ack = agent_client(token).post(f"/api/v1/agent/commands/{first[0]['id']}/ack", {"ok": True}, format="json")
    assert ack.status_code == 200
    again = agent_client(token).post(f"/api/v1/agent/commands/{first[0]['id']}/ack", {"ok": True}, format="json")
    assert again.status_code == 200 and again.json()["acked_at"] == ack.json()["acked_at"]
    assert beat(token, []).json()["commands"] == []
    command = Command.objects.get()
    assert command.delivery_count == 2 and command.worker == worker


def test_r7_heartbeat_refreshes_node_last_seen_and_reports_unknown_workers(owner):
    node, token = make_node(provider=owner, online=False)
    reply = beat(token, [(Worker(pk="8f9ac2c6-7c5e-4b1d-9a70-5d0a1a1c0c01"), "ready")], at=T0)
    assert reply.json()["workers"][0]["status"] == "unknown"
    node.refresh_from_db()
    assert node.last_seen_at == T0


def test_r7_failed_start_ack_frees_the_node(owner, model):
    node, token = make_node(provider=owner)
    worker = place_worker(node)
    command = Command.objects.get()
    agent_client(token).post(f"/api/v1/agent/commands/{command.pk}/ack", {"ok": False, "detail": "OOM"}, format="json")
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.LOST


def test_r7_guard_marks_silent_workers_lost_but_not_fresh_ones(owner, model):
    with time_machine.travel(T0, tick=False):
        node, token = make_node(provider=owner)
        other, other_token = make_node(provider=owner)
        silent = make_ready_worker(node, model=model)
        fresh = make_ready_worker(other, model=model)
    beat(other_token, [(fresh, "ready")], at=T0 + timedelta(seconds=20))
    with time_machine.travel(T0 + timedelta(seconds=31), tick=False):
        assert expire_workers()["lost"] == 1
    silent.refresh_from_db()
    fresh.refresh_from_db()
    assert silent.status == WorkerStatus.LOST and fresh.status == WorkerStatus.READY


def test_r7_guard_holds_when_most_of_the_fleet_goes_stale_at_once(owner, model):
    with time_machine.travel(T0, tick=False):
        workers = [make_ready_worker(make_node(provider=owner)[0], model=model) for _ in range(5)]
    with time_machine.travel(T0 + timedelta(seconds=31), tick=False):
        report = expire_workers()
    assert report["held"] is True and report["lost"] == 0
    assert Worker.objects.filter(pk__in=[w.pk for w in workers], status=WorkerStatus.READY).count() == 5


def test_r9_worker_registering_on_paused_node_comes_back_draining_and_gets_stop(
    owner, model, django_capture_on_commit_callbacks
):
    node, token = make_node(provider=owner, is_spot=True)
    pause_node(node_id=node.pk)
    with django_capture_on_commit_callbacks(execute=True):
        response = agent_client(token).post(
            "/api/v1/agent/workers",
            {"model": model.name, "endpoint": "http://127.0.0.1:7001", "max_slots": 4},
            format="json",
        )
    assert response.status_code == 201
    assert response.json()["status"] == "draining"
    worker = Worker.objects.get(pk=response.json()["id"])
    assert worker.status == WorkerStatus.STOPPED  # stopped right after the commit
    assert Reclaim.objects.filter(node=node, trigger="late_registration").count() == 1
    assert Command.objects.get(kind="stop_worker").payload["worker_id"] == str(worker.pk)
    router_heartbeat(instance_id="r1")
    assert acquire_slot(worker_id=worker.pk, router_instance="r1") is None  # never a request


def test_r9_registration_with_worker_id_moves_starting_to_ready(owner, model):
    node, token = make_node(provider=owner)
    worker = place_worker(node)
    response = agent_client(token).post(
        "/api/v1/agent/workers",
        {"model": model.name, "endpoint": "http://127.0.0.1:7001", "max_slots": 4, "worker_id": str(worker.pk)},
        format="json",
    )
    assert response.status_code == 201 and response.json() == {"id": str(worker.pk), "status": "ready"}
    worker.refresh_from_db()
    assert worker.endpoint == "http://127.0.0.1:7001" and worker.max_slots == 4


def test_r9_registration_of_a_placed_worker_after_pause_stays_draining(owner, model):
    node, token = make_node(provider=owner, is_spot=True)
    worker = place_worker(node)
    pause_node(node_id=node.pk)
    response = agent_client(token).post(
        "/api/v1/agent/workers",
        {"model": model.name, "endpoint": "http://127.0.0.1:7001", "max_slots": 4, "worker_id": str(worker.pk)},
        format="json",
    )
    assert response.json()["status"] in ("draining", "stopped")
    worker.refresh_from_db()
    assert worker.status != WorkerStatus.READY


def test_r9_unknown_model_is_400(owner, model):
    node, token = make_node(provider=owner)
    response = agent_client(token).post(
        "/api/v1/agent/workers", {"model": "nope", "endpoint": "http://127.0.0.1:7001", "max_slots": 4}, format="json"
    )
    assert response.status_code == 400 and response.json()["code"] == "unknown_model"
    assert not Worker.objects.exists()
    assert Node.objects.get(pk=node.pk).workload_enabled
