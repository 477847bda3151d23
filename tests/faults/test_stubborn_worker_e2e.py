"""Fault: a model server that ignores SIGTERM (R5). The agent kills it when the stop grace runs out.

Real processes: a stack, the reference agent (python -m simulator.agent) per
node, its workers started as `python -m simulator.model_server ... --ignore-sigterm`.
A pause stops each worker; the agent SIGTERMs the process, waits the grace the
stop_worker command carries (STOP_GRACE_S), then SIGKILLs it. Asserted per
trial: the process is gone no later than grace + one heartbeat + slack after
the stop was issued, the agent acked the stop (exit code -9, the kill), and
the stop was issued once.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from psycopg.rows import dict_row

from simulator.stack import Stack, pid_alive, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

GRACE_S = 2
ENV = {"HEARTBEAT_INTERVAL_S": 1, "DRAIN_CEILING_S": 3, "STOP_GRACE_S": GRACE_S, "DRAIN_TICK_S": 1, "LOG_LEVEL": "INFO"}
OWNER = {"username": "owner", "password": "owner-pass-123"}
TRIALS = 3
STUBBORN = "{python} -m simulator.model_server --host {host} --port {port} --model {model} --ignore-sigterm"


@pytest.fixture
def agent_stack(faults_stack_urls, tmp_path) -> Iterator[Stack]:
    database_url, broker_url = faults_stack_urls
    with Stack(database_url, broker_url, ENV, log_dir=tmp_path, celery_concurrency=1,
               fresh_database=True, drop_database_on_stop=True) as stack:
        stack.manage("seed_demo")
        yield stack


def sql(stack: Stack, query: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    with stack.db() as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else []


def test_fault_worker_ignoring_sigterm_is_killed_at_the_grace(agent_stack: Stack, fault_report) -> None:
    stack = agent_stack
    token = stack.api().post("/api/v1/auth/token", json=OWNER).json()["token"]
    api = stack.api(token)
    started = time.monotonic()
    trials = []
    for i in range(TRIALS):
        created = api.post(
            "/api/v1/nodes",
            json={"name": f"stubborn-{i}", "is_spot": True, "price_per_hour": "1.00", "gpu_model": "A100", "vram_gb": 80},
        )
        assert created.status_code == 201, created.text
        node = created.json()
        stack.start_agent(
            node["agent_token"], worker_cmd=STUBBORN, stop_grace_s=GRACE_S, cloud="aws",
            instance_id=f"i-{secrets.token_hex(6)}", instance_type="p4d.24xlarge", region="us-east-1", zone="us-east-1a",
        )

        def ready() -> dict[str, Any] | None:
            workers = api.get(f"/api/v1/nodes/{node['id']}").json()["workers"]
            return next((w for w in workers if w["status"] == "ready"), None)

        worker = wait_until(ready, 30, f"a ready worker on node {node['id']}", interval=0.1, on_timeout=stack.diagnostics)
        endpoint = sql(stack, "SELECT endpoint FROM nodes_worker WHERE id = %s", (worker["id"],))[0]["endpoint"]
        pid = int(httpx.get(f"{endpoint}/sim/stats", timeout=2, trust_env=False).json()["pid"])
        trials.append((node["id"], worker["id"], pid))

    for node_id, _, _ in trials:
        response = api.post(f"/api/v1/nodes/{node_id}/pause")
        assert response.status_code == 202, response.text

    bound_s = GRACE_S + float(ENV["HEARTBEAT_INTERVAL_S"]) + 3
    took = []
    by_command = 0
    for node_id, worker_id, pid in trials:
        stop = wait_until(
            lambda: sql(stack, "SELECT * FROM nodes_command WHERE worker_id = %s AND kind = 'stop_worker'", (worker_id,)),
            10, "the stop_worker command", interval=0.1, on_timeout=stack.diagnostics,
        )
        assert len(stop) == 1
        wait_until(lambda: not pid_alive(pid), bound_s + 5, f"model server {pid} to be gone", interval=0.05, on_timeout=stack.diagnostics)
        acked = wait_until(
            lambda: sql(stack, "SELECT * FROM nodes_command WHERE id = %s AND acked_at IS NOT NULL", (stop[0]["id"],)),
            10, "the agent's ack of stop_worker", interval=0.1, on_timeout=stack.diagnostics,
        )[0]
        assert acked["ok"] is True
        # Two ways the agent ends it, both SIGTERM, the grace, then SIGKILL: the stop_worker
        # command ("stopped, exit code -9"), or, when a heartbeat reply saying "stopped" got
        # there first, the status path, after which the command finds it "already gone".
        killed_by_command = "exit code -9" in acked["detail"]
        assert killed_by_command or "already gone" in acked["detail"], f"unexpected ack: {acked['detail']!r}"
        took_s = (acked["acked_at"] - acked["created_at"]).total_seconds()
        assert took_s <= bound_s, f"stop issued {took_s:.2f} s before the ack (bound {bound_s:g} s)"
        if killed_by_command:
            # The ack comes right after the process is reaped: the grace was given first.
            delivered_to_ack = (acked["acked_at"] - acked["first_delivered_at"]).total_seconds()
            assert delivered_to_ack >= GRACE_S - 0.2, f"killed after only {delivered_to_ack:.2f} s: the grace was not given"
        # Either way the process, which ignores SIGTERM, is gone: it was SIGKILLed.
        assert not pid_alive(pid)
        by_command += killed_by_command
        took.append(took_s)
    fault_report(
        f"fault: model server ignores SIGTERM: {len(trials)} trials (real agents), each SIGKILLed after the {GRACE_S} s grace "
        f"({by_command} by the stop command, {len(trials) - by_command} by the stopped status in a heartbeat reply); "
        f"stop issued -> acked in {min(took):.2f}..{max(took):.2f} s (bound {bound_s:g} s), {time.monotonic() - started:.1f} s"
    )
