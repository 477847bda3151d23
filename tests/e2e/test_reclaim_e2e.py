"""A spot reclaim through the real processes: API -> database -> Celery -> agent -> model server (R2, R5).

Timings come from the stack's settings (conftest.E2E_ENV): heartbeats every
1 s, an 8 s drain ceiling, a 2 s stop grace. The slack in each bound below is
what the design allows on top of them: one heartbeat to deliver the stop, the
grace to end the process, one drain tick (1 s) to notice a deadline.
"""

from __future__ import annotations

import secrets
import time
import uuid
from datetime import timedelta

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]


def test_r2_r5_pause_stops_the_worker_process_and_resume_places_a_new_one(e2e) -> None:
    node, _agent = e2e.spot_node_with_agent("e2e-pause")
    worker = e2e.ready_worker(node["id"])
    endpoint, pid = e2e.model_server(worker["id"])
    assert e2e.serves(endpoint, worker["model"])

    paused = e2e.pause(node["id"])
    paused_at = time.monotonic()
    assert paused["workload_enabled"] is False
    assert paused["state"] in ("draining", "paused")
    deadline = e2e.parse_time(paused["reclaim"]["deadline"])
    ceiling_s = float(e2e.env["DRAIN_CEILING_S"])
    # Nothing is in flight: the drain ends at once, the stop reaches the agent
    # with its next heartbeat, and the process gets the stop grace to exit.
    bound_s = ceiling_s + float(e2e.env["HEARTBEAT_INTERVAL_S"]) + float(e2e.env["STOP_GRACE_S"]) + 2
    e2e.wait(lambda: e2e.server_gone(endpoint, pid), bound_s, "the model server process to be gone")
    gone_s = time.monotonic() - paused_at
    assert e2e.now() <= deadline + timedelta(seconds=bound_s - ceiling_s), f"gone only after {gone_s:.1f} s"

    def finished_reclaim() -> dict | None:
        reclaims = e2e.reclaims(node["id"])
        done = [r for r in reclaims if r["id"] == paused["reclaim"]["id"] and r["finished_at"]]
        return done[0] if done else None

    reclaim = e2e.wait(finished_reclaim, 5, "the reclaim to finish")
    assert reclaim["trigger"] == "owner_pause"
    assert reclaim["in_flight_at_start"] == 0 and reclaim["cut"] == 0
    [stopped] = reclaim["workers"]
    assert stopped["id"] == worker["id"]
    assert stopped["stop_reason"] == "drained"
    assert e2e.parse_time(stopped["stopped_at"]) <= deadline
    kinds = [event["kind"] for event in reclaim["timeline"]]
    assert kinds[0] in ("drain_started", "worker_draining", "workload_disabled")
    assert "worker_stopped" in kinds and "reclaim_finished" in kinds

    # The agent acknowledged the stop_worker command.
    acked = e2e.wait(
        lambda: e2e.sql(
            "SELECT acked_at, ok FROM nodes_command WHERE worker_id = %s AND kind = 'stop_worker' AND acked_at IS NOT NULL",
            (worker["id"],),
        ),
        5,
        "the agent to ack stop_worker",
    )
    assert acked[0]["ok"] is True
    node_after = e2e.node(node["id"])
    assert node_after["state"] == "paused" and node_after["workers"] == []
    # Read once more, after the ack: the reclaim's timeline shows it.
    assert "stop_worker_acked" in [e["kind"] for e in finished_reclaim()["timeline"]]

    response = e2e.api.post(f"/api/v1/nodes/{node['id']}/resume")
    assert response.status_code == 200, response.text
    assert response.json()["workload_enabled"] is True
    again = e2e.ready_worker(node["id"], not_ids=(worker["id"],))
    new_endpoint, new_pid = e2e.model_server(again["id"])
    assert new_pid != pid
    assert e2e.serves(new_endpoint, again["model"])
    assert e2e.node(node["id"])["state"] == "available"


def test_r5_a_request_that_never_ends_is_cut_at_the_ceiling(e2e) -> None:
    node, _agent = e2e.spot_node_with_agent("e2e-ceiling")
    worker = e2e.ready_worker(node["id"])
    endpoint, pid = e2e.model_server(worker["id"])

    # An in-flight router request, as the router would hold it: a slot whose
    # router instance keeps beating (its last beat in the future), so the
    # heartbeat guard never releases it and only the ceiling can end the drain.
    router = f"e2e-router-{secrets.token_hex(4)}"
    with e2e.stack.db() as conn, conn.transaction():
        conn.execute(
            "INSERT INTO nodes_routerinstance (id, started_at, last_beat_at) VALUES (%s, now(), now() + interval '1 day')",
            (router,),
        )
        conn.execute(
            "INSERT INTO nodes_slot (id, worker_id, router_instance, request_id, acquired_at) VALUES (%s, %s, %s, %s, now())",
            (uuid.uuid4(), worker["id"], router, "e2e-request"),
        )
        held = conn.execute(
            "UPDATE nodes_worker SET in_flight = in_flight + 1 WHERE id = %s AND status = 'ready'", (worker["id"],)
        ).rowcount
    assert held == 1

    paused = e2e.pause(node["id"])
    deadline = e2e.parse_time(paused["reclaim"]["deadline"])
    assert paused["state"] == "draining"
    assert [w["in_flight"] for w in paused["workers"]] == [1]

    ceiling_s = float(e2e.env["DRAIN_CEILING_S"])
    row = e2e.wait(
        lambda: (r := e2e.worker_row(worker["id"]))["status"] == "stopped" and r,
        ceiling_s + 6,
        "the drain to end at its ceiling",
        interval=0.1,
    )
    late_s = (row["stopped_at"] - deadline).total_seconds()
    assert row["stop_reason"] == "ceiling"
    assert row["requests_cut"] == 1
    assert 0 <= late_s <= 2.0, f"stopped {late_s:.2f} s after the deadline"
    assert e2e.sql("SELECT id FROM nodes_slot WHERE worker_id = %s", (worker["id"],)) == []

    grace_s = float(e2e.env["HEARTBEAT_INTERVAL_S"]) + float(e2e.env["STOP_GRACE_S"]) + 2
    e2e.wait(lambda: e2e.server_gone(endpoint, pid), grace_s, "the model server process to be gone after the cut")

    [reclaim] = [r for r in e2e.reclaims(node["id"]) if r["id"] == paused["reclaim"]["id"]]
    assert reclaim["trigger"] == "owner_pause"
    assert reclaim["finished_at"] is not None
    assert reclaim["in_flight_at_start"] == 1
    assert reclaim["cut"] == 1 and reclaim["completed"] == 0
    [stopped] = reclaim["workers"]
    assert stopped["stop_reason"] == "ceiling" and stopped["requests_cut"] == 1
