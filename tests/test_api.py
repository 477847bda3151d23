"""The public contract of API.md: paths, codes and field names."""

import pytest
from rest_framework.test import APIClient

from nodes.models import Node
from nodes.tokens import hash_token
from rentals.services import start_rental
from tests.conftest import agent_client
from tests.factories import UserFactory, make_node

pytestmark = pytest.mark.django_db


def test_auth_token_with_username_and_password(db):
    UserFactory(username="alice")
    client = APIClient()
    response = client.post("/api/v1/auth/token", {"username": "alice", "password": "pw-correct-horse"}, format="json")
    assert response.status_code == 200
    token = response.json()["token"]
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/v1/nodes").status_code == 200
    bad = APIClient().post("/api/v1/auth/token", {"username": "alice", "password": "wrong"}, format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid"


def test_create_node_returns_agent_token_once_and_stores_its_hash(owner_api, owner):
    response = owner_api.post(
        "/api/v1/nodes",
        {"name": "rig-1", "is_spot": True, "price_per_hour": "2.5", "cloud": "aws", "instance_type": "p4d.24xlarge",
         "region": "us-east-1", "zone": "us-east-1a", "cloud_instance_id": "i-0abc"},
        format="json",
    )
    assert response.status_code == 201
    body = response.json()
    token = body["agent_token"]
    node = Node.objects.get(pk=body["id"])
    assert node.agent_token_hash == hash_token(token) and token not in node.agent_token_hash
    assert body["pool"] == {"cloud": "aws", "instance_type": "p4d.24xlarge", "region": "us-east-1", "zone": "us-east-1a"}
    assert body["state"] == "offline" and body["rented"] is False and body["workers"] == []
    assert body["price_per_hour"] == 2.5 and body["cloud_instance_id"] == "i-0abc"
    assert "agent_token" not in owner_api.get(f"/api/v1/nodes/{node.pk}").json()
    hello = agent_client(token).post(
        "/api/v1/agent/hello",
        {"hardware": {"gpu_model": "A100", "gpu_count": 8, "vram_gb": 80},
         "cloud": {"provider": "aws", "instance_id": "i-0abc", "instance_type": "p4d.24xlarge", "region": "us-east-1", "zone": "us-east-1a"}},
        format="json",
    )
    assert hello.status_code == 200
    assert hello.json()["node_id"] == node.pk and hello.json()["heartbeat_interval_s"] == 5.0
    assert owner_api.get(f"/api/v1/nodes/{node.pk}").json()["state"] == "available"


def test_offers_list_rentable_nodes_with_filters(owner, renter, renter_api):
    spot, _ = make_node(provider=owner, is_spot=True, gpu_model="H100", price_per_hour="3.00")
    ondemand, _ = make_node(provider=owner, is_spot=False, gpu_model="A100", price_per_hour="1.00")
    rented, _ = make_node(provider=owner)
    make_node(provider=owner, online=False)
    start_rental(renter=UserFactory(), node_id=rented.pk)
    offers = renter_api.get("/api/v1/offers").json()
    assert [o["id"] for o in offers] == [ondemand.pk, spot.pk]
    assert set(offers[0]) >= {"id", "name", "is_spot", "price_per_hour", "gpu_model", "gpu_count", "pool", "reliability"}
    assert [o["id"] for o in renter_api.get("/api/v1/offers?is_spot=true").json()] == [spot.pk]
    assert [o["id"] for o in renter_api.get("/api/v1/offers?gpu_model=a100").json()] == [ondemand.pk]
    assert [o["id"] for o in renter_api.get("/api/v1/offers?max_price=2").json()] == [ondemand.pk]
    assert renter_api.get("/api/v1/offers?max_price=cheap").status_code == 400


def test_rental_lifecycle_over_the_api(owner, renter, renter_api, owner_api):
    node, _ = make_node(provider=owner, is_spot=False)
    created = renter_api.post("/api/v1/rentals", {"node": node.pk, "hours": 2}, format="json").json()
    assert created["status"] == "active" and created["term_ends_at"] is not None
    assert owner_api.get(f"/api/v1/nodes/{node.pk}").json()["state"] == "rented"
    ended = renter_api.post(f"/api/v1/rentals/{created['id']}/end")
    assert ended.status_code == 200
    assert ended.json()["status"] == "ended" and ended.json()["end_reason"] == "renter"
    again = renter_api.post(f"/api/v1/rentals/{created['id']}/end")
    assert again.status_code == 409 and again.json()["code"] == "rental_ended"
    assert [r["id"] for r in renter_api.get("/api/v1/rentals").json()] == [created["id"]]


def test_provider_ending_a_rental_records_provider(owner, renter, owner_api):
    node, _ = make_node(provider=owner)
    rental = start_rental(renter=renter, node_id=node.pk)
    body = owner_api.post(f"/api/v1/rentals/{rental.pk}/end").json()
    assert body["end_reason"] == "provider"


def test_rental_term_ends_by_itself(owner, renter):
    from datetime import timedelta

    import time_machine
    from django.utils import timezone

    from rentals.services import carry_out_due_rentals

    node, _ = make_node(provider=owner)
    rental = start_rental(renter=renter, node_id=node.pk, hours=1)
    with time_machine.travel(timezone.now() + timedelta(hours=1, seconds=1), tick=False):
        assert carry_out_due_rentals()["term"] == 1
    rental.refresh_from_db()
    assert rental.status == "ended" and rental.end_reason == "term"


def test_schema_and_docs_are_served(client):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    text = schema.content.decode()
    for path in ("/api/v1/nodes/{node_id}/pause", "/api/v1/agent/heartbeat", "/api/v1/rentals"):
        assert path in text
    assert client.get("/api/docs/").status_code == 200
    assert client.get("/healthz").json() == {"ok": True}
