"""R14: every actor sees and changes only its own; bad input is a 4xx that changes nothing."""

import pytest
from rest_framework.test import APIClient

from nodes.models import Command, Node, Worker, WorkerStatus
from nodes.placement import place_worker
from rentals.models import Rental
from rentals.services import start_rental
from tests.conftest import agent_client
from tests.factories import make_node, make_ready_worker

pytestmark = pytest.mark.django_db


def test_r14_agent_token_cannot_heartbeat_another_nodes_worker(owner, model):
    node_a, token_a = make_node(provider=owner)
    node_b, _ = make_node(provider=owner)
    own = make_ready_worker(node_a, model=model)
    foreign = make_ready_worker(node_b, model=model)
    Worker.objects.filter(pk=foreign.pk).update(status=WorkerStatus.STARTING)
    before = Worker.objects.get(pk=foreign.pk).expires_at
    own_before = Worker.objects.get(pk=own.pk).expires_at
    response = agent_client(token_a).post(
        "/api/v1/agent/heartbeat",
        {"workers": [{"id": str(own.pk), "status": "ready"}, {"id": str(foreign.pk), "status": "ready"}]},
        format="json",
    )
    assert response.status_code == 403 and response.json()["code"] == "worker_not_on_node"
    foreign.refresh_from_db()
    assert foreign.status == WorkerStatus.STARTING and foreign.expires_at == before
    assert Worker.objects.get(pk=own.pk).expires_at == own_before


def test_r14_agent_token_cannot_register_a_worker_id_of_another_node(owner, model):
    _, token_a = make_node(provider=owner)
    node_b, _ = make_node(provider=owner)
    foreign = place_worker(node_b)
    response = agent_client(token_a).post(
        "/api/v1/agent/workers",
        {"model": model.name, "endpoint": "http://127.0.0.1:7001", "max_slots": 4, "worker_id": str(foreign.pk)},
        format="json",
    )
    assert response.status_code == 403
    foreign.refresh_from_db()
    assert foreign.status == WorkerStatus.STARTING and foreign.endpoint == ""


def test_r14_agent_token_cannot_ack_another_nodes_command(owner, model):
    _, token_a = make_node(provider=owner)
    node_b, _ = make_node(provider=owner)
    place_worker(node_b)
    command = Command.objects.get(node=node_b)
    response = agent_client(token_a).post(f"/api/v1/agent/commands/{command.pk}/ack", {"ok": True}, format="json")
    assert response.status_code == 404
    command.refresh_from_db()
    assert command.acked_at is None


def test_r14_bad_agent_token_is_401(db):
    response = agent_client("agt_wrong").post("/api/v1/agent/heartbeat", {"workers": []}, format="json")
    assert response.status_code == 401
    assert response.json()["code"] == "authentication_failed"


def test_r14_agent_token_is_not_a_user_login(owner):
    node, token = make_node(provider=owner)
    assert agent_client(token).get("/api/v1/nodes").status_code in (401, 403)


def test_r14_provider_cannot_see_or_pause_another_providers_node(owner, outsider_api, model):
    node, _ = make_node(provider=owner, is_spot=True)
    make_ready_worker(node, model=model)
    for method, path in (
        ("get", f"/api/v1/nodes/{node.pk}"),
        ("patch", f"/api/v1/nodes/{node.pk}"),
        ("post", f"/api/v1/nodes/{node.pk}/pause"),
        ("post", f"/api/v1/nodes/{node.pk}/resume"),
        ("get", f"/api/v1/nodes/{node.pk}/reclaims"),
    ):
        response = getattr(outsider_api, method)(path, {"is_spot": False}, format="json")
        assert response.status_code == 404, path
        assert response.json()["code"] == "not_found"
    assert outsider_api.get("/api/v1/nodes").json() == []
    node.refresh_from_db()
    assert node.workload_enabled and node.is_spot


def test_r14_renter_cannot_read_or_end_another_renters_rental(owner, renter, outsider_api):
    node, _ = make_node(provider=owner)
    rental = start_rental(renter=renter, node_id=node.pk)
    assert outsider_api.get(f"/api/v1/rentals/{rental.pk}").status_code == 404
    assert outsider_api.post(f"/api/v1/rentals/{rental.pk}/end").status_code == 404
    assert outsider_api.get("/api/v1/rentals").json() == []
    rental.refresh_from_db()
    assert rental.status == "active"


def test_r14_provider_sees_rentals_on_their_nodes_but_not_the_notice_token(owner, renter, owner_api):
    node, _ = make_node(provider=owner)
    rental = start_rental(renter=renter, node_id=node.pk)
    body = owner_api.get(f"/api/v1/rentals/{rental.pk}").json()
    assert body["id"] == rental.pk and body["notice_url"] is None


def test_r14_anonymous_is_401_everywhere_but_the_notice(db):
    client = APIClient()
    for path in ("/api/v1/nodes", "/api/v1/offers", "/api/v1/rentals"):
        response = client.get(path)
        assert response.status_code == 401, path
        assert response.json()["code"] == "not_authenticated"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"is_spot": True, "price_per_hour": "1"}, "name"),
        ({"name": "n", "price_per_hour": "-1"}, "price_per_hour"),
        ({"name": "n", "price_per_hour": "abc"}, "price_per_hour"),
        ({"name": "x" * 101, "price_per_hour": "1"}, "name"),
        ({"name": "bad\x00name", "price_per_hour": "1"}, "name"),
        ({"name": "n", "price_per_hour": "1", "vram_gb": -5}, "vram_gb"),
    ],
)
def test_r14_malformed_node_create_is_400_with_field_errors_and_changes_nothing(owner_api, body, field):
    response = owner_api.post("/api/v1/nodes", body, format="json")
    assert response.status_code == 400
    data = response.json()
    assert data["code"] == "invalid" and field in data
    assert not Node.objects.exists()


def test_r14_malformed_json_is_400_parse_error(owner_api):
    response = owner_api.generic("POST", "/api/v1/nodes", "{not json", content_type="application/json")
    assert response.status_code == 400 and response.json()["code"] == "parse_error"


def test_r14_malformed_heartbeat_is_400_and_changes_nothing(owner, model):
    node, token = make_node(provider=owner, online=False)
    response = agent_client(token).post("/api/v1/agent/heartbeat", {"workers": [{"id": "not-a-uuid"}]}, format="json")
    assert response.status_code == 400 and "workers" in response.json()
    node.refresh_from_db()
    assert node.last_seen_at is None


def test_r14_rental_of_missing_own_or_paused_node_is_409_node_unavailable(owner, renter, renter_api, owner_api):
    own, _ = make_node(provider=renter)
    paused, _ = make_node(provider=owner, is_spot=True)
    owner_api.post(f"/api/v1/nodes/{paused.pk}/pause")
    offline, _ = make_node(provider=owner, online=False)
    for node_id in (999999, own.pk, paused.pk, offline.pk):
        response = renter_api.post("/api/v1/rentals", {"node": node_id}, format="json")
        assert response.status_code == 409, node_id
        assert response.json()["code"] == "node_unavailable"
    assert not Rental.objects.exists()


def test_r14_second_rental_of_a_rented_node_is_409(owner, renter, outsider_api):
    node, _ = make_node(provider=owner)
    start_rental(renter=renter, node_id=node.pk)
    response = outsider_api.post("/api/v1/rentals", {"node": node.pk}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "node_unavailable"
    assert Rental.objects.count() == 1
