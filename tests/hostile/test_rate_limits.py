"""Issue #8: rate limits on login, agents and webhooks trigger at their configured rate,
answer 429 {"code": "throttled"} with Retry-After, and guard no safety rule."""

import json

import pytest
from django.test import Client
from rest_framework.test import APIClient

from nodes.models import Command, Node, Worker, WorkerStatus
from nodes.services import pause_node
from preemption.models import PreemptionNotice
from preemption.signing import sign
from tests.conftest import agent_client
from tests.factories import UserFactory, make_node, make_ready_worker

pytestmark = pytest.mark.django_db


def assert_throttled(response):
    assert response.status_code == 429, response.content
    body = response.json()
    assert body["code"] == "throttled" and body["detail"]
    assert int(response["Retry-After"]) >= 1


def test_defaults_are_generous_and_configured(settings):
    # One heartbeat per second per node is never limited at all; the other agent
    # calls get ten a second per token before the limit.
    assert settings.THROTTLE_AGENT_RATE == "600/min"
    assert settings.THROTTLE_LOGIN_RATE == "10/min"
    assert settings.THROTTLE_WEBHOOK_RATE == "6000/min"


def test_api_login_is_limited_per_ip_and_username(settings):
    settings.THROTTLE_LOGIN_RATE = "3/min"
    UserFactory(username="alice")
    client = APIClient()
    for _ in range(3):
        assert client.post("/api/v1/auth/token", {"username": "alice", "password": "wrong"}, format="json").status_code == 400
    response = client.post("/api/v1/auth/token", {"username": "alice", "password": "pw-correct-horse"}, format="json")
    assert_throttled(response)  # even the right password waits: the limit comes first
    # Another username from the same address, and the same username from another address, have their own budget.
    assert client.post("/api/v1/auth/token", {"username": "bob", "password": "x"}, format="json").status_code == 400
    other_ip = APIClient(REMOTE_ADDR="10.1.2.3")
    ok = other_ip.post("/api/v1/auth/token", {"username": "alice", "password": "pw-correct-horse"}, format="json")
    assert ok.status_code == 200 and ok.json()["token"]


def test_api_login_limit_ignores_a_spoofed_forwarded_for(settings):
    settings.THROTTLE_LOGIN_RATE = "2/min"
    client = APIClient()
    for i in range(2):
        client.post("/api/v1/auth/token", {"username": "carol", "password": "x"}, format="json", HTTP_X_FORWARDED_FOR=f"10.0.0.{i}")
    response = client.post("/api/v1/auth/token", {"username": "carol", "password": "x"}, format="json", HTTP_X_FORWARDED_FOR="10.9.9.9")
    assert_throttled(response)


def test_portal_login_form_is_limited_and_shares_the_budget(settings):
    settings.THROTTLE_LOGIN_RATE = "2/min"
    UserFactory(username="dave")
    client = Client()
    assert client.post("/accounts/login/", {"username": "dave", "password": "wrong"}).status_code == 200  # form with an error
    assert APIClient().post("/api/v1/auth/token", {"username": "dave", "password": "wrong"}, format="json").status_code == 400
    response = client.post("/accounts/login/", {"username": "dave", "password": "pw-correct-horse"})
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert b"Too many sign-in attempts" in response.content
    assert "_auth_user_id" not in client.session  # not logged in
    # Unthrottled, the right password logs in.
    settings.THROTTLE_LOGIN_RATE = ""
    response = client.post("/accounts/login/", {"username": "dave", "password": "pw-correct-horse"})
    assert response.status_code == 302 and "_auth_user_id" in client.session


def test_agent_calls_are_limited_per_token_but_never_the_heartbeat(settings, owner, model):
    settings.THROTTLE_AGENT_RATE = "3/min"
    node_a, token_a = make_node(provider=owner)
    _, token_b = make_node(provider=owner)
    agent_a, agent_b = agent_client(token_a), agent_client(token_b)
    for _ in range(3):
        assert agent_a.post("/api/v1/agent/hello", {}, format="json").status_code == 200
    assert_throttled(agent_a.post("/api/v1/agent/hello", {}, format="json"))
    before = Worker.objects.count()
    assert_throttled(
        agent_a.post("/api/v1/agent/workers", {"model": model.name, "endpoint": "http://127.0.0.1:7001", "max_slots": 4}, format="json")
    )
    assert Worker.objects.count() == before  # a throttled call changes nothing
    assert_throttled(agent_a.post("/api/v1/agent/notices", {"source": "generic", "document": {}}, format="json"))
    # Node B's agent has its own budget; A's heartbeats are never limited.
    assert agent_b.post("/api/v1/agent/hello", {}, format="json").status_code == 200
    for _ in range(10):
        assert agent_a.post("/api/v1/agent/heartbeat", {"workers": []}, format="json").status_code == 200


def test_a_throttled_agent_still_receives_its_stop_and_cannot_undo_a_drain(
    settings, owner, model, django_capture_on_commit_callbacks
):
    """No rule depends on the limit: the stop of a drain reaches a throttled agent,
    and nothing a throttled agent does moves its worker out of draining or stopped."""
    settings.THROTTLE_AGENT_RATE = "1/min"
    node, token = make_node(provider=owner, is_spot=True)
    worker = make_ready_worker(node, model=model)
    agent = agent_client(token)
    assert agent.post("/api/v1/agent/hello", {"workers": [str(worker.pk)]}, format="json").status_code == 200
    assert_throttled(agent.post("/api/v1/agent/hello", {}, format="json"))

    with django_capture_on_commit_callbacks(execute=True):
        pause_node(node_id=node.pk)  # the drain finishes at once (no request in flight) and queues the stop
    stop = Command.objects.get(node=node, kind="stop_worker")

    reply = agent.post(
        "/api/v1/agent/heartbeat", {"workers": [{"id": str(worker.pk), "status": "ready", "in_flight": 0}]}, format="json"
    )
    assert reply.status_code == 200
    body = reply.json()
    assert str(stop.pk) in [c["id"] for c in body["commands"]]
    assert all(w["status"] != "ready" for w in body["workers"] if w["id"] == str(worker.pk))
    # Its ack is throttled: the stop stays pending and is delivered again with the next heartbeat.
    assert_throttled(agent.post(f"/api/v1/agent/commands/{stop.pk}/ack", {"ok": True}, format="json"))
    stop.refresh_from_db()
    assert stop.acked_at is None
    again = agent.post("/api/v1/agent/heartbeat", {"workers": []}, format="json").json()
    assert str(stop.pk) in [c["id"] for c in again["commands"]]
    # A throttled re-registration cannot bring the worker back as ready.
    assert_throttled(
        agent.post(
            "/api/v1/agent/workers",
            {"model": model.name, "endpoint": "http://127.0.0.1:7001", "max_slots": 4, "worker_id": str(worker.pk)},
            format="json",
        )
    )
    worker.refresh_from_db()
    assert worker.status in (WorkerStatus.DRAINING, WorkerStatus.STOPPED)
    assert Node.objects.get(pk=node.pk).workload_enabled is False


def test_webhooks_are_limited_per_sender_after_the_signature(settings):
    settings.THROTTLE_WEBHOOK_RATE = "2/min"
    client = APIClient()
    body = json.dumps({"event_id": "e-1", "instance_id": "i-unknown", "action": "terminate"}).encode()

    def post(raw, signature, ip="203.0.113.5"):
        return client.post(
            "/api/v1/preemption/generic", data=raw, content_type="application/json", HTTP_X_SIGNATURE=signature, REMOTE_ADDR=ip
        )

    # Unsigned requests are refused before they count.
    for _ in range(5):
        assert post(body, "sha256=" + "0" * 64).status_code == 401
    assert post(body, sign(body)).status_code == 202
    assert post(body, sign(body)).status_code == 202
    rows = PreemptionNotice.objects.count()
    assert_throttled(post(body.replace(b"e-1", b"e-2"), sign(body.replace(b"e-1", b"e-2"))))
    assert PreemptionNotice.objects.count() == rows
    assert post(body.replace(b"e-1", b"e-3"), sign(body.replace(b"e-1", b"e-3")), ip="203.0.113.6").status_code == 202
