"""Portal view tests: three personas (owner, renter, outsider) plus staff, through Django's test client."""

import secrets

import pytest
from django.test import Client
from django.utils import timezone

from nodes.models import Node, Worker, WorkerStatus
from tests.factories import UserFactory

HTMX = {"HTTP_HX_REQUEST": "true"}


def web_client(user) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def owner_web(owner) -> Client:
    return web_client(owner)


@pytest.fixture
def renter_web(renter) -> Client:
    return web_client(renter)


@pytest.fixture
def outsider_web(outsider) -> Client:
    return web_client(outsider)


@pytest.fixture
def staff(db):
    return UserFactory(username="staff", is_staff=True)


@pytest.fixture
def staff_web(staff) -> Client:
    return web_client(staff)


def bulk_nodes(provider, count: int, *, model=None, workers_every: int = 3, **fields) -> list[Node]:
    """Many online nodes at once (bulk insert, not create_node: the query-count tests need 1,000)."""
    now = timezone.now()
    fields.setdefault("gpu_model", "A100")
    fields.setdefault("price_per_hour", "1.50")
    nodes = Node.objects.bulk_create(
        [
            Node(provider=provider, name=f"bulk-{i}", agent_token_hash=secrets.token_hex(32), last_seen_at=now, **fields)
            for i in range(count)
        ]
    )
    if model is not None:
        Worker.objects.bulk_create(
            [
                Worker(node=node, model=model, status=WorkerStatus.READY, max_slots=8, in_flight=i % 8,
                       expires_at=now + timezone.timedelta(seconds=30), ready_at=now)
                for i, node in enumerate(nodes) if i % workers_every == 0
            ]
        )
    return nodes
