"""Issue #8, R14: a NUL byte in a JSON string and a 1 MB body are a 4xx with the
error shape, never a 5xx, and change nothing (PostgreSQL refuses NUL in text and
jsonb, so each must be caught before the database)."""

import json

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from inference.models import ApiKey
from nodes.models import Node, Worker
from preemption.models import PreemptionNotice
from preemption.signing import sign
from rentals.models import RenderJob, Rental
from tests.factories import UserFactory, make_node

pytestmark = pytest.mark.django_db

NUL = "a\x00b"
MB = 1024 * 1024


@pytest.fixture
def world(model, settings):
    settings.PREEMPTION_MODE = "prod"
    owner = UserFactory(username="owner")
    staff = UserFactory(username="staff", is_staff=True)
    node, agent_token = make_node(provider=owner, is_spot=True, cloud="aws", cloud_instance_id="i-0nul")
    user, agent, admin, anon = APIClient(), APIClient(), APIClient(), APIClient()
    user.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=owner).key}")
    admin.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=staff).key}")
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {agent_token}")
    return {"user": user, "agent": agent, "staff": admin, "anon": anon, "node": node, "owner": owner}


def state():
    def rows(model):
        return sorted(map(str, model.objects.values_list()))

    # NoticeCount is left out: an unreadable document is counted as `invalid` by design (R15), and is no row of state.
    return {m.__name__: rows(m) for m in (Node, Worker, Rental, RenderJob, ApiKey, PreemptionNotice)}


def webhook_post(client, source: str, raw: bytes, *, signed: bool = True):
    headers = {"HTTP_X_SIGNATURE": sign(raw)} if signed else {}
    return client.post(f"/api/v1/preemption/{source}", data=raw, content_type="application/json", **headers)


def assert_refused(response, before):
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    body = response.json()
    assert body["code"] and body["detail"], body
    assert state() == before, "a refused request changed something"


def nul_cases(w):
    node = w["node"]
    return [
        ("user", "POST", "/api/v1/auth/token", {"username": NUL, "password": "x"}),
        ("user", "POST", "/api/v1/nodes", {"name": NUL, "price_per_hour": "1", "is_spot": True}),
        ("user", "POST", "/api/v1/nodes", {"name": "n", "price_per_hour": "1", "cloud_instance_id": NUL}),
        ("user", "PATCH", f"/api/v1/nodes/{node.pk}", {"name": NUL}),
        ("user", "POST", "/api/v1/api-keys", {"name": NUL}),
        ("user", "POST", "/api/v1/render-jobs", {"frames": "1-\x0010"}),
        ("staff", "POST", f"/api/v1/staff/providers/{w['owner'].pk}/delist", {"reason": NUL}),
        ("agent", "POST", "/api/v1/agent/hello", {"hardware": {"gpu_model": NUL}, "cloud": {"instance_id": NUL}}),
        ("agent", "POST", "/api/v1/agent/heartbeat", {"workers": [{"id": "0" * 8 + "-0000-0000-0000-" + "0" * 12, "status": NUL}]}),
        ("agent", "POST", "/api/v1/agent/workers", {"model": NUL, "endpoint": "http://127.0.0.1:7001", "max_slots": 1}),
        ("agent", "POST", "/api/v1/agent/notices", {"source": "aws", "document": {"action": "terminate", "time": NUL}}),
        ("agent", "POST", "/api/v1/agent/notices", {"source": "generic", "document": {"event_id": NUL, "action": "terminate"}}),
    ]


@pytest.mark.parametrize("index", range(12))
def test_nul_byte_in_a_json_string_is_4xx_and_changes_nothing(world, index):
    role, method, path, body = nul_cases(world)[index]
    before = state()
    response = world[role].generic(method, path, json.dumps(body), content_type="application/json")
    assert_refused(response, before)


@pytest.mark.parametrize("source", ["aws", "azure", "gcp", "generic"])
def test_nul_byte_in_a_signed_webhook_document_is_4xx_and_leaves_no_row(world, source):
    docs_with_nul = {
        "aws": {"id": NUL, "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
                "time": "2026-11-30T12:00:00Z", "detail": {"instance-id": "i-0nul", "instance-action": "terminate"}},
        "azure": {"DocumentIncarnation": 1, "Events": [{"EventId": NUL, "EventType": "Preempt", "ResourceType": "VirtualMachine",
                                                        "Resources": ["i-0nul"], "NotBefore": ""}]},
        "gcp": {"message": {"data": NUL, "messageId": "1"}, "subscription": "s"},
        "generic": {"event_id": NUL, "instance_id": "i-0nul", "action": "terminate"},
    }
    before = state()
    assert_refused(webhook_post(world["anon"], source, json.dumps(docs_with_nul[source]).encode()), before)


def test_nul_byte_in_a_query_parameter_is_4xx(world):
    before = state()
    for query in ("gpu_model=a%00b", "max_price=nan", "max_price=inf"):
        response = world["user"].get(f"/api/v1/offers?{query}")
        assert response.status_code == 400, (query, response.content[:200])
        assert response.json()["code"] == "invalid"
    assert state() == before


def big_cases(w):
    node = w["node"]
    pad = "x" * MB
    return [
        ("anon", "/api/v1/auth/token", {"username": "owner", "password": pad}),
        ("user", "/api/v1/nodes", {"name": pad, "price_per_hour": "1"}),
        ("user", f"/api/v1/nodes/{node.pk}/pause", {"pad": pad}),  # a body the endpoint ignores is still read
        ("user", "/api/v1/render-jobs", {"frames": pad}),
        ("agent", "/api/v1/agent/heartbeat", {"workers": [{"id": "x", "status": pad}]}),
        ("agent", "/api/v1/agent/workers", {"model": pad, "endpoint": "http://127.0.0.1:7001", "max_slots": 1}),
        ("agent", "/api/v1/agent/notices", {"source": "aws", "document": {"pad": pad}}),
    ]


@pytest.mark.parametrize("index", range(7))
def test_one_megabyte_body_is_4xx_and_changes_nothing(world, index):
    role, path, body = big_cases(world)[index]
    raw = json.dumps(body)
    assert len(raw) > MB
    before = state()
    response = world[role].generic("POST", path, raw, content_type="application/json")
    if path.endswith("/pause"):
        # Pause takes no body: a padded one is ignored, not a 5xx (the pause itself is the point).
        assert response.status_code == 202
        return
    assert_refused(response, before)


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_one_megabyte_webhook_is_4xx_and_leaves_no_row(world, signed):
    raw = json.dumps({"event_id": "big", "instance_id": "i-0nul", "action": "terminate", "pad": "x" * MB}).encode()
    before = state()
    response = webhook_post(world["anon"], "generic", raw, signed=signed)
    assert_refused(response, before)


def test_a_body_beyond_djangos_upload_limit_is_4xx(world, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = MB // 2
    raw = json.dumps({"name": "n", "price_per_hour": "1", "pad": "x" * MB})
    before = state()
    response = world["user"].generic("POST", "/api/v1/nodes", raw, content_type="application/json")
    assert 400 <= response.status_code < 500, response.status_code
    assert state() == before


@pytest.mark.parametrize(
    "query",
    [
        "on_demand_price=1e308&discount=0.7&mtbi_hours=10&checkpoint_hours=0.1&restart_hours=0.1&work_hours=5",
        "on_demand_price=10&discount=0.7&mtbi_hours=10&checkpoint_hours=0.1&restart_hours=0.1&work_hours=1e308",
        "on_demand_price=nan&discount=0.7&mtbi_hours=10&checkpoint_hours=0.1&restart_hours=0.1&work_hours=5",
    ],
    ids=["overflowing-price", "overflowing-hours", "nan"],
)
def test_economics_inputs_that_overflow_are_400_not_500(world, query):
    response = world["user"].get(f"/api/v1/economics?{query}")
    assert response.status_code == 400, response.content[:300]
    assert response.json()["code"] in ("invalid", "out_of_range")
