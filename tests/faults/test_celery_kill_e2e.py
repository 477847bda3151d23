"""Fault: the Celery worker is SIGKILLed between drains' starts and their finishes (R5, R8).

A stack of its own with a 3 s drain ceiling, a 1 s drain tick and two Celery
workers (as production runs more than one). Each batch pauses nodes whose
worker holds a request (so the drain must wait for its deadline), then
SIGKILLs one Celery worker's whole process group at a random moment while the
drains are pending and starts it again. Whatever the killed worker had taken
(the finish due at the deadline, a tick) dies with it; the drain tick on the
other worker is the backstop. Invariants, per drain: it finishes once, its
stored deadline never moves, one stop_worker command is issued, and the stop
comes no later than deadline + 2 s.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime

import pytest

from simulator.stack import Stack, wait_until
from tests.faults.conftest import held_router, spot_node_with_worker, sql

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

ENV = {
    "DRAIN_CEILING_S": 3,
    "DRAIN_TICK_S": 1,
    "HEARTBEAT_INTERVAL_S": 1,
    "STOP_GRACE_S": 1,
    # No agents here: the guard must not mark the silent workers lost while they drain.
    "WORKER_EXPIRY_S": 600,
    "NODE_OFFLINE_S": 600,
    "LOG_LEVEL": "INFO",
}
OWNER = {"username": "owner", "password": "owner-pass-123"}  # made by `manage.py seed_demo`
BATCHES, PER_BATCH = 5, 4  # 20 drains, 5 kills
LATE_BOUND_S = 2.0


@pytest.fixture
def kill_stack(faults_stack_urls, tmp_path) -> Iterator[Stack]:
    database_url, broker_url = faults_stack_urls
    with Stack(
        database_url, broker_url, ENV, log_dir=tmp_path, celery_concurrency=1,
        fresh_database=True, drop_database_on_stop=True,
    ) as stack:
        stack.manage("seed_demo")
        stack.start_celery_worker("worker-b", concurrency=1)
        yield stack


def test_fault_celery_worker_kill9_during_drains(kill_stack: Stack, fault_report) -> None:
    stack = kill_stack
    rng = random.Random()
    token = stack.api().post("/api/v1/auth/token", json=OWNER).json()["token"]
    api = stack.api(token)
    model = sql(stack, "SELECT name FROM nodes_servedmodel ORDER BY id LIMIT 1")[0]["name"]
    router = held_router(stack)

    def ready_node(i: int) -> tuple[int, str, bool]:
        held = i % PER_BATCH != 0  # three of four drains wait for their deadline, one stops at once
        node_id, worker_id = spot_node_with_worker(stack, api, model, f"kill-{i}", hold_for=router if held else None)
        return node_id, worker_id, held

    nodes = [ready_node(i) for i in range(BATCHES * PER_BATCH)]
    paused: dict[str, datetime] = {}  # worker id -> the deadline the pause answered
    kills: list[str] = []
    started = time.monotonic()
    for batch in range(BATCHES):
        for node_id, worker_id, _held in nodes[batch * PER_BATCH : (batch + 1) * PER_BATCH]:
            response = api.post(f"/api/v1/nodes/{node_id}/pause")
            assert response.status_code == 202, response.text
            deadline = datetime.fromisoformat(response.json()["reclaim"]["deadline"].replace("Z", "+00:00"))
            paused[worker_id] = deadline
            time.sleep(rng.uniform(0, 0.3))
        # A random moment while this batch's drains wait for their deadline (3 s ceiling).
        time.sleep(rng.uniform(0.2, 2.8))
        victim = "worker" if batch % 2 == 0 else "worker-b"
        stack.kill_process(stack.procs[victim])
        kills.append(victim)
        stack.start_celery_worker(victim, concurrency=1)

    worker_ids = list(paused)

    def all_stopped() -> bool:
        rows = sql(stack, "SELECT count(*) AS n FROM nodes_worker WHERE id = ANY(%s::uuid[]) AND status = 'stopped'", (worker_ids,))
        return rows[0]["n"] == len(worker_ids)

    wait_until(all_stopped, 20, "every drained worker to be stopped", interval=0.1, on_timeout=stack.diagnostics)
    time.sleep(1.5)  # a late duplicate finish, if any, would land now

    rows = {str(r["id"]): r for r in sql(stack, "SELECT * FROM nodes_worker WHERE id = ANY(%s::uuid[])", (worker_ids,))}
    late = {}
    for worker_id, answered in paused.items():
        row = rows[worker_id]
        assert row["status"] == "stopped", row
        assert row["drain_deadline"] == answered, f"{worker_id}: stored deadline moved from {answered} to {row['drain_deadline']}"
        late[worker_id] = (row["stopped_at"] - row["drain_deadline"]).total_seconds()
    held = {w for _, w, h in nodes if h}
    assert all(rows[w]["stop_reason"] == "ceiling" for w in held)
    assert max(late.values()) <= LATE_BOUND_S, f"stopped late beyond {LATE_BOUND_S} s: {sorted(late.values())}"
    stops = Counter(
        str(r["worker_id"])
        for r in sql(stack, "SELECT worker_id FROM nodes_command WHERE kind = 'stop_worker' AND worker_id = ANY(%s::uuid[])", (worker_ids,))
    )
    assert stops == Counter({w: 1 for w in worker_ids}), stops
    finishes = Counter(
        str(r["worker_id"])
        for r in sql(stack, "SELECT worker_id FROM nodes_nodeevent WHERE kind = 'worker_stopped' AND worker_id = ANY(%s::uuid[])", (worker_ids,))
    )
    assert finishes == Counter({w: 1 for w in worker_ids}), finishes
    open_reclaims = sql(
        stack,
        "SELECT r.id FROM nodes_reclaim r JOIN nodes_worker w ON w.reclaim_id = r.id WHERE w.id = ANY(%s::uuid[]) AND r.finished_at IS NULL",
        (worker_ids,),
    )
    assert open_reclaims == []
    held_late = sorted(late[w] for w in held)
    elapsed = time.monotonic() - started
    fault_report(
        f"fault: celery worker kill -9 during drains: {len(worker_ids)} trials (drains) over {len(kills)} kills, "
        f"each stopped once, 1 stop command each, deadlines unmoved; lateness after deadline "
        f"max {max(late.values()):.2f} s, median {held_late[len(held_late) // 2]:.2f} s (bound {LATE_BOUND_S:g} s), {elapsed:.1f} s"
    )
