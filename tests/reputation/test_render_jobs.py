"""R3 for render jobs: only ever on an on-demand node; a node running one counts as rented."""

import pytest

from marketplace.errors import NodeRented
from nodes.models import Command, Worker, WorkerStatus
from nodes.services import set_spot
from rentals.models import RenderJob, RenderStatus
from rentals.render import schedule_render_jobs
from rentals.services import end_rental, start_rental
from tests.conftest import agent_client
from tests.factories import make_node, make_ready_worker

pytestmark = pytest.mark.django_db


def test_r3_render_job_runs_on_an_idle_on_demand_node_and_finishes_from_the_ack(owner, renter, renter_api, model):
    make_node(provider=owner, is_spot=True, price_per_hour="0.10")  # cheaper, but spot
    node, token = make_node(provider=owner, is_spot=False, price_per_hour="2.00")
    response = renter_api.post("/api/v1/render-jobs", {"frames": "1-240"}, format="json")
    assert response.status_code == 201
    job_id = response.json()["id"]
    job = RenderJob.objects.get(pk=job_id)
    assert response.json()["frame_count"] == 240
    assert schedule_render_jobs() == 1
    job.refresh_from_db()
    assert job.status == RenderStatus.RUNNING and job.node == node
    command = Command.objects.get(kind="run_render")
    assert command.node == node and command.payload == {"job_id": job.pk, "frames": "1-240"}
    ack = agent_client(token).post(f"/api/v1/agent/commands/{command.pk}/ack", {"ok": True, "detail": "rendered 240 frames"}, format="json")
    assert ack.status_code == 200
    body = renter_api.get(f"/api/v1/render-jobs/{job_id}").json()
    assert body["status"] == "done" and body["detail"] == "rendered 240 frames"
    assert Worker.objects.filter(node=node, status=WorkerStatus.STARTING).exists()  # free again: placement ran


def test_r3_render_job_waits_when_only_spot_nodes_are_idle(owner, renter, renter_api):
    make_node(provider=owner, is_spot=True)
    make_node(provider=owner, is_spot=True)
    renter_api.post("/api/v1/render-jobs", {"frames": "1-10"}, format="json")
    assert schedule_render_jobs() == 0
    assert RenderJob.objects.get().status == RenderStatus.QUEUED
    assert not Command.objects.filter(kind="run_render").exists()


def test_r3_render_job_never_lands_on_a_node_that_turned_spot_while_it_was_queued(owner, renter, renter_api):
    node, _ = make_node(provider=owner, is_spot=False)
    rental = start_rental(renter=renter, node_id=node.pk)  # the only on-demand node is busy
    renter_api.post("/api/v1/render-jobs", {"frames": "1-10"}, format="json")
    assert schedule_render_jobs() == 0
    end_rental(rental_id=rental.pk, reason="renter")
    set_spot(node_id=node.pk, is_spot=True)
    assert schedule_render_jobs() == 0
    assert RenderJob.objects.get().status == RenderStatus.QUEUED


def test_r3_render_job_drains_inference_first_then_runs(owner, renter, renter_api, model, django_capture_on_commit_callbacks):
    node, _ = make_node(provider=owner, is_spot=False)
    worker = make_ready_worker(node, model=model)
    renter_api.post("/api/v1/render-jobs", {"frames": "1-10"}, format="json")
    with django_capture_on_commit_callbacks(execute=True):
        schedule_render_jobs()
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED
    assert RenderJob.objects.get().status == RenderStatus.RUNNING
    assert Command.objects.filter(kind="run_render").count() == 1


def test_r10_node_running_a_render_job_counts_as_rented(owner, renter, renter_api, owner_api):
    node, _ = make_node(provider=owner, is_spot=False)
    renter_api.post("/api/v1/render-jobs", {"frames": "1-10"}, format="json")
    schedule_render_jobs()
    response = owner_api.patch(f"/api/v1/nodes/{node.pk}", {"is_spot": True}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "node_rented"
    with pytest.raises(NodeRented):
        set_spot(node_id=node.pk, is_spot=True)
    assert owner_api.get(f"/api/v1/nodes/{node.pk}").json()["state"] == "rented"
    assert renter_api.get("/api/v1/offers").json() == []


@pytest.mark.parametrize("frames", ["", "abc", "10-1", "1-2000000", "1-5,x"])
def test_r14_bad_frame_ranges_are_400(renter_api, frames):
    response = renter_api.post("/api/v1/render-jobs", {"frames": frames}, format="json")
    assert response.status_code == 400 and "frames" in response.json()
    assert not RenderJob.objects.exists()


def test_r14_renter_sees_only_own_render_jobs(renter_api, outsider_api):
    job_id = renter_api.post("/api/v1/render-jobs", {"frames": "1-3"}, format="json").json()["id"]
    assert outsider_api.get(f"/api/v1/render-jobs/{job_id}").status_code == 404
    assert outsider_api.get("/api/v1/render-jobs").json() == []
