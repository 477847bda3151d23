"""R14, issue #8: every /api/v1 operation against every kind of caller, each cell's status asserted.

Roles: the provider of nodes A and B (owner), the renter of node B (renter),
a user with nothing (outsider), a staff user, the agents of node A and of
node B, and nobody (anon). Users authenticate as clients do
(`Authorization: Token ...`), agents with `Authorization: Bearer <agent token>`;
no one holds the webhook secret. A new endpoint in the URLconf that this table
does not list fails `test_matrix_covers_every_api_v1_operation`.
"""

import json
from datetime import timedelta
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from inference.keys import create_api_key
from nodes.models import Command
from nodes.placement import place_worker
from rentals.render import create_render_job
from rentals.services import start_rental
from tests.factories import UserFactory, make_node
from tests.preemption import docs

ROLES = ("owner", "renter", "outsider", "staff", "agent_a", "agent_b", "anon")

# (method, route as in the URLconf) -> expected status per role, in ROLES order.
#   owner renter outsider staff agent_a agent_b anon
MATRIX: dict[tuple[str, str], tuple[int, ...]] = {
    ("POST", "auth/token"):                                   (200, 200, 200, 200, 200, 200, 200),  # open: the password speaks
    ("GET", "nodes"):                                         (200, 200, 200, 200, 401, 401, 401),
    ("POST", "nodes"):                                        (201, 201, 201, 201, 401, 401, 401),
    ("GET", "nodes/<int:node_id>"):                           (200, 404, 404, 404, 401, 401, 401),
    ("PATCH", "nodes/<int:node_id>"):                         (200, 404, 404, 404, 401, 401, 401),
    ("POST", "nodes/<int:node_id>/pause"):                    (202, 404, 404, 404, 401, 401, 401),
    ("POST", "nodes/<int:node_id>/resume"):                   (200, 404, 404, 404, 401, 401, 401),
    ("GET", "nodes/<int:node_id>/reclaims"):                  (200, 404, 404, 404, 401, 401, 401),
    ("GET", "offers"):                                        (200, 200, 200, 200, 401, 401, 401),
    ("GET", "rentals"):                                       (200, 200, 200, 200, 401, 401, 401),
    ("POST", "rentals"):                                      (409, 201, 201, 201, 401, 401, 401),  # not one's own node
    ("GET", "rentals/<int:rental_id>"):                       (200, 200, 404, 404, 401, 401, 401),  # provider and renter
    ("POST", "rentals/<int:rental_id>/end"):                  (200, 200, 404, 404, 401, 401, 401),
    ("GET", "api-keys"):                                      (200, 200, 200, 200, 401, 401, 401),
    ("POST", "api-keys"):                                     (201, 201, 201, 201, 401, 401, 401),
    ("DELETE", "api-keys/<int:key_id>"):                      (404, 200, 404, 404, 401, 401, 401),
    ("GET", "render-jobs"):                                   (200, 200, 200, 200, 401, 401, 401),
    ("POST", "render-jobs"):                                  (201, 201, 201, 201, 401, 401, 401),
    ("GET", "render-jobs/<int:job_id>"):                      (404, 200, 404, 404, 401, 401, 401),
    ("GET", "reputation"):                                    (200, 200, 200, 200, 401, 401, 401),
    ("GET", "staff/providers"):                               (403, 403, 403, 200, 401, 401, 401),
    ("POST", "staff/providers/<int:provider_id>/delist"):     (403, 403, 403, 200, 401, 401, 401),
    ("POST", "staff/providers/<int:provider_id>/reinstate"):  (403, 403, 403, 200, 401, 401, 401),
    ("POST", "agent/hello"):                                  (401, 401, 401, 401, 200, 200, 401),
    ("POST", "agent/heartbeat"):                              (401, 401, 401, 401, 200, 403, 401),  # A's worker
    ("POST", "agent/workers"):                                (401, 401, 401, 401, 201, 403, 401),  # A's worker id
    ("POST", "agent/commands/<uuid:command_id>/ack"):         (401, 401, 401, 401, 200, 404, 401),  # A's command
    ("POST", "agent/notices"):                                (401, 401, 401, 401, 202, 202, 401),  # acts on the sender's node only
    ("POST", "preemption/aws"):                               (401, 401, 401, 401, 401, 401, 401),  # unsigned
    ("POST", "preemption/azure"):                             (401, 401, 401, 401, 401, 401, 401),
    ("POST", "preemption/gcp"):                               (401, 401, 401, 401, 401, 401, 401),
    ("POST", "preemption/generic"):                           (401, 401, 401, 401, 401, 401, 401),
    ("GET", "pools"):                                         (200, 200, 200, 200, 401, 401, 401),
    ("GET", "economics"):                                     (200, 200, 200, 200, 401, 401, 401),
}

ECONOMICS = "on_demand_price=3&discount=0.7&mtbi_hours=10&checkpoint_hours=0.1&restart_hours=0.1&work_hours=5"


def api_v1_operations() -> set[tuple[str, str]]:
    """(method, route) of every view under api/v1/ in the URLconf, from the views' own handlers."""
    found: set[tuple[str, str]] = set()

    def walk(patterns: list, prefix: str) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                route = prefix + str(p.pattern)
                if not route.startswith("api/v1/"):
                    continue
                view = getattr(p.callback, "view_class", None) or getattr(p.callback, "cls", None)
                methods = [m for m in ("get", "post", "put", "patch", "delete") if view is None or hasattr(view, m)]
                found.update((m.upper(), route.removeprefix("api/v1/")) for m in methods)

    walk(get_resolver().url_patterns, "")
    return found


def test_matrix_covers_every_api_v1_operation():
    in_urlconf = api_v1_operations()
    assert in_urlconf - set(MATRIX) == set(), "new /api/v1 operations: add them to MATRIX with each role's status"
    assert set(MATRIX) - in_urlconf == set(), "MATRIX lists operations the URLconf no longer has"
    assert all(len(row) == len(ROLES) for row in MATRIX.values())


class World:
    """The data every cell starts from (fresh per test)."""

    def __init__(self, model: Any) -> None:
        self.owner = UserFactory(username="owner")
        self.renter = UserFactory(username="renter")
        self.outsider = UserFactory(username="outsider")
        self.staff = UserFactory(username="staff", is_staff=True)
        self.node_a, self.token_a = make_node(provider=self.owner, is_spot=True, cloud="aws", cloud_instance_id="i-0aaa")
        self.node_b, self.token_b = make_node(provider=self.owner, is_spot=False)
        self.worker_a = place_worker(self.node_a)  # starting, with its start_worker command
        assert self.worker_a is not None
        self.command_a = Command.objects.filter(node=self.node_a).first()
        self.rental = start_rental(renter=self.renter, node_id=self.node_b.pk)
        self.key, _ = create_api_key(user=self.renter, name="k")
        self.job = create_render_job(renter=self.renter, frames="1-10")

    def client(self, role: str) -> APIClient:
        client = APIClient()
        if role in ("owner", "renter", "outsider", "staff"):
            token, _ = Token.objects.get_or_create(user=getattr(self, role))
            client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        elif role == "agent_a":
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token_a}")
        elif role == "agent_b":
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token_b}")
        return client

    def request(self, method: str, route: str) -> tuple[str, Any]:
        """The concrete path and a body that the allowed caller would send."""
        now = timezone.now()
        ids = {
            "<int:node_id>": self.node_a.pk,
            "<int:rental_id>": self.rental.pk,
            "<int:key_id>": self.key.pk,
            "<int:job_id>": self.job.pk,
            "<int:provider_id>": self.owner.pk,
            "<uuid:command_id>": self.command_a.pk,
        }
        path = route
        for placeholder, value in ids.items():
            path = path.replace(placeholder, str(value))
        bodies: dict[tuple[str, str], Any] = {
            ("POST", "auth/token"): {"username": "owner", "password": "pw-correct-horse"},
            ("POST", "nodes"): {"name": "new-node", "is_spot": True, "price_per_hour": "2.00"},
            ("PATCH", "nodes/<int:node_id>"): {"name": "renamed"},
            ("POST", "rentals"): {"node": self.node_a.pk},
            ("POST", "api-keys"): {"name": "mine"},
            ("POST", "render-jobs"): {"frames": "1-24"},
            ("POST", "staff/providers/<int:provider_id>/delist"): {"reason": "audit"},
            ("POST", "staff/providers/<int:provider_id>/reinstate"): {"reason": "audit"},
            ("POST", "agent/hello"): {"hardware": {"gpu_model": "A100", "gpu_count": 1, "vram_gb": 80}},
            ("POST", "agent/heartbeat"): {"workers": [{"id": str(self.worker_a.pk), "status": "ready", "in_flight": 0}]},
            ("POST", "agent/workers"): {
                "model": self.worker_a.model.name, "endpoint": "http://127.0.0.1:7001", "max_slots": 4,
                "worker_id": str(self.worker_a.pk),
            },
            ("POST", "agent/commands/<uuid:command_id>/ack"): {"ok": True},
            ("POST", "agent/notices"): {"source": "aws", "document": docs.imds_action(at=now + timedelta(seconds=120))},
            ("POST", "preemption/aws"): docs.aws_warning(instance_id="i-0aaa", at=now),
            ("POST", "preemption/azure"): docs.azure_doc(resources=["vm-a"], not_before=now + timedelta(seconds=60)),
            ("POST", "preemption/gcp"): docs.gcp_push(instance_id="i-0aaa", at=now),
            ("POST", "preemption/generic"): docs.generic(node_id=self.node_a.pk),
        }
        if route == "economics":
            path += "?" + ECONOMICS
        return path, bodies.get((method, route))


def snapshot() -> dict[str, Any]:
    """Everything a call could change, as values (tokens excepted: auth/token creates one)."""
    from django.contrib.auth import get_user_model

    from inference.models import ApiKey
    from nodes.models import Node, Reclaim, Worker
    from preemption.models import PreemptionNotice
    from rentals.models import RenderJob, Rental
    from reputation.models import ProviderReputation

    def rows(model: Any) -> list:
        return sorted(map(str, model.objects.values_list()))

    return {m.__name__: rows(m) for m in (
        get_user_model(), Node, Worker, Command, Reclaim, Rental, RenderJob, ApiKey, PreemptionNotice, ProviderReputation,
    )}


CELLS = [
    pytest.param(method, route, role, row[i], id=f"{method} {route} as {role}")
    for (method, route), row in MATRIX.items()
    for i, role in enumerate(ROLES)
]


@pytest.mark.django_db
@pytest.mark.parametrize("method, route, role, expected", CELLS)
def test_authorization_matrix(method, route, role, expected, model):
    world = World(model)
    path, body = world.request(method, route)
    client = world.client(role)
    kwargs = {"data": json.dumps(body), "content_type": "application/json"} if body is not None else {}
    before = snapshot()
    response = client.generic(method, f"/api/v1/{path}", **kwargs)
    assert response.status_code == expected, (response.status_code, response.content[:300])
    if expected >= 400:
        assert snapshot() == before, "a refused call changed something"
        data = response.json()
        assert set(data) >= {"code", "detail"}, data  # the contract's error shape, always
    if expected == 401:
        assert response.has_header("WWW-Authenticate")  # a 401 tells the caller how to authenticate
