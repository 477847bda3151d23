"""R15 and operations: every transition counted in /metrics; health and readiness; JSON logs."""

import json
import logging
import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from nodes.drain import finish_drain
from nodes.services import pause_node
from nodes.slots import acquire_slot, router_heartbeat
from rentals.services import carry_out_due_rentals, start_rental
from tests.factories import make_node, make_ready_worker

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def scrape(client, **headers) -> dict[str, float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200
    values = {}
    for line in response.content.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_r15_drains_cuts_workers_slots_and_reclaimed_rentals_are_counted(client, owner, renter, model):
    before = scrape(client)
    with time_machine.travel(T0, tick=False):
        node, _ = make_node(provider=owner, is_spot=True)
        worker = make_ready_worker(node, model=model)
        router_heartbeat(instance_id="r1")
        acquire_slot(worker_id=worker.pk, router_instance="r1")
        rented, _ = make_node(provider=owner, is_spot=True)
        start_rental(renter=renter, node_id=rented.pk)
        pause_node(node_id=node.pk)
        pause_node(node_id=rented.pk)
        during = scrape(client)
    with time_machine.travel(T0 + timedelta(seconds=121), tick=False):
        finish_drain(worker.pk)
        carry_out_due_rentals()
        after = scrape(client)

    def moved(name: str, snapshot: dict) -> float:
        return snapshot.get(name, 0) - before.get(name, 0)

    assert moved('drains_started_total{trigger="owner_pause"}', after) == 2
    assert moved('slots_in_use', during) == 1 and moved("slots_in_use", after) == 0
    assert moved('workers{status="draining"}', during) == 1
    assert moved('workers{status="stopped"}', after) == 1
    assert moved('drains_finished_total{outcome="cut",trigger="owner_pause"}', after) == 1
    assert moved('drains_finished_total{outcome="clean",trigger="owner_pause"}', after) == 1
    assert moved("requests_cut_total", after) == 1
    assert moved("rentals_reclaimed_total", after) == 1
    # Both took 121 s: the cut one ran to its deadline, the clean one waited for its rental's notice.
    assert moved('drain_duration_seconds_bucket{le="120"}', after) == 0
    assert moved('drain_duration_seconds_bucket{le="150"}', after) == 2
    assert moved("drain_duration_seconds_count", after) == 2


def test_r15_heartbeats_are_counted_and_late_ones_flagged(client, owner, model):
    from tests.conftest import agent_client

    from django.utils import timezone

    node, token = make_node(provider=owner, now=timezone.now() - timedelta(seconds=60))
    before = scrape(client)
    agent_client(token).post("/api/v1/agent/heartbeat", {"workers": []}, format="json")  # 60 s after the last: late
    agent_client(token).post("/api/v1/agent/heartbeat", {"workers": []}, format="json")  # on time
    after = scrape(client)
    assert after["agent_heartbeats_total"] - before.get("agent_heartbeats_total", 0) == 2
    assert after["agent_heartbeats_late_total"] - before.get("agent_heartbeats_late_total", 0) == 1


def test_r15_metrics_token_is_required_when_set(client, settings):
    settings.METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def test_healthz_and_readyz(client):
    assert client.get("/healthz").json() == {"ok": True}
    response = client.get("/readyz")
    assert response.status_code == 200 and response.json() == {"ok": True, "down": []}


def test_readyz_names_the_broker_when_it_is_down(client, settings, monkeypatch):
    from marketplace.celery import app

    monkeypatch.setattr(app.conf, "broker_url", "redis://127.0.0.1:1/0")  # nothing listens on port 1
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["down"] and response.json()["down"][0].startswith("broker (redis)")


def test_transitions_log_one_line_each_with_their_ids(owner, model, caplog):
    node, _ = make_node(provider=owner, is_spot=True)
    worker = make_ready_worker(node, model=model)
    with caplog.at_level(logging.INFO, logger="nodes.events"):
        _, reclaim = pause_node(node_id=node.pk)
    drained = [r for r in caplog.records if r.event == "worker_draining"]
    assert len(drained) == 1
    assert drained[0].node_id == node.pk and drained[0].worker_id == str(worker.pk) and drained[0].reclaim_id == reclaim.pk
    assert any(r.event == "drain_started" for r in caplog.records)


def test_json_log_format_renders_a_json_object(owner):
    from pythonjsonlogger.json import JsonFormatter

    formatter = JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s", rename_fields={"levelname": "level"})
    record = logging.LogRecord("nodes.events", logging.INFO, __file__, 1, "drain_started node=%s", (7,), None)
    record.event, record.node_id = "drain_started", 7
    line = json.loads(formatter.format(record))
    assert line["event"] == "drain_started" and line["node_id"] == 7 and line["level"] == "INFO"
    assert re.match(r"drain_started node=7", line["message"])
