"""R10 (spot flag frozen under a rental) and R13 (the IMDS-compatible notice)."""

from datetime import UTC, datetime

import pytest
import time_machine

from nodes.models import Node
from rentals.services import end_rental, start_rental
from tests.factories import make_node

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def test_r10_patch_is_spot_on_rented_node_is_409_node_rented(owner, renter, owner_api):
    node, _ = make_node(provider=owner, is_spot=True)
    start_rental(renter=renter, node_id=node.pk)
    response = owner_api.patch(f"/api/v1/nodes/{node.pk}", {"is_spot": False}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "node_rented"
    assert Node.objects.get(pk=node.pk).is_spot is True


def test_r10_patch_is_spot_on_idle_node_works_and_rental_keeps_its_flag(owner, renter, owner_api):
    node, _ = make_node(provider=owner, is_spot=False)
    response = owner_api.patch(f"/api/v1/nodes/{node.pk}", {"is_spot": True}, format="json")
    assert response.status_code == 200 and response.json()["is_spot"] is True
    rental = start_rental(renter=renter, node_id=node.pk)
    assert rental.is_spot is True
    end_rental(rental_id=rental.pk, reason="renter")
    owner_api.patch(f"/api/v1/nodes/{node.pk}", {"is_spot": False}, format="json")
    rental.refresh_from_db()
    assert rental.is_spot is True  # fixed at its start, for good


def test_r10_same_value_on_rented_node_is_not_a_change(owner, renter, owner_api):
    node, _ = make_node(provider=owner, is_spot=True)
    start_rental(renter=renter, node_id=node.pk)
    response = owner_api.patch(f"/api/v1/nodes/{node.pk}", {"is_spot": True}, format="json")
    assert response.status_code == 200


def test_r13_notice_url_is_404_then_terminate_at_reclaim_at(owner, renter, renter_api, owner_api):
    node, _ = make_node(provider=owner, is_spot=True)
    created = renter_api.post("/api/v1/rentals", {"node": node.pk}, format="json")
    assert created.status_code == 201
    body = created.json()
    assert body["status"] == "active" and body["reclaim_at"] is None and body["is_spot"] is True
    notice_url = body["notice_url"]
    assert notice_url.endswith("/latest/meta-data/spot/instance-action")

    anonymous = renter_api.__class__()  # the container has no credentials
    assert anonymous.get(notice_url).status_code == 404
    with time_machine.travel(T0, tick=False):
        owner_api.post(f"/api/v1/nodes/{node.pk}/pause")
    response = anonymous.get(notice_url)
    assert response.status_code == 200
    assert response.json() == {"action": "terminate", "time": "2026-11-30T12:02:00Z"}
    rental = renter_api.get(f"/api/v1/rentals/{body['id']}").json()
    assert rental["status"] == "reclaiming" and rental["reclaim_at"] == "2026-11-30T12:02:00Z"


def test_r13_unknown_notice_token_is_404(client):
    assert client.get("/meta/not-a-token/latest/meta-data/spot/instance-action").status_code == 404
