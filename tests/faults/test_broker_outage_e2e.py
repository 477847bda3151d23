"""Fault: the broker (Redis) is down while pauses and preemption webhooks arrive (R2, R8, R12).

A private redis-server on a free port is this stack's broker (the shared Redis
is never touched). With it stopped, owners pause nodes and a cloud's webhook
reclaims others: each request must still answer as usual, with the transition
committed (workload off, workers draining, a Reclaim row), although the
follow-up tasks could not be enqueued. Once Redis is back, beat's ticks and
recovery finish every drain: nothing is lost, each worker is stopped once.

The Celery worker rides the outage out: the same process, never restarted,
reconnects and runs the ticks that finish the drains. Redis dies while the
worker holds an unacknowledged message (a tick due in a minute, reserved until
then), the case in which kombu's Redis transport used to make the worker exit
(marketplace/broker.py).
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from simulator.procs import free_port
from simulator.stack import Stack, port_open, wait_until
from preemption.signing import sign
from tests.faults.conftest import held_router, spot_node_with_worker, sql

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

SECRET = f"faults-{secrets.token_hex(8)}"
ENV = {
    "DRAIN_CEILING_S": 3,
    "DRAIN_TICK_S": 1,
    "RECOVERY_S": 2,
    "HEARTBEAT_INTERVAL_S": 1,
    "WORKER_EXPIRY_S": 600,
    "NODE_OFFLINE_S": 600,
    "PREEMPTION_WEBHOOK_SECRET": SECRET,
    "PREEMPTION_MODE": "prod",  # notices reclaim (the default, shadow, only records what it would do)
    "LOG_LEVEL": "INFO",
}
OWNER = {"username": "owner", "password": "owner-pass-123"}
PAUSES, WEBHOOKS = 4, 4


class PrivateRedis:
    def __init__(self, log_dir) -> None:
        self.port = free_port("127.0.0.1")
        self.log = log_dir / "private-redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        wait_until(lambda: port_open("127.0.0.1", self.port), 10, "the private redis-server to listen")

    def crash(self) -> None:
        """SIGKILL: what it held (queued tasks, reserved ones) is gone with it."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(5)
            self.proc = None
        wait_until(lambda: not port_open("127.0.0.1", self.port), 5, "the private redis-server to be gone")


@pytest.fixture
def outage(faults_stack_urls, tmp_path) -> Iterator[tuple[Stack, PrivateRedis]]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: the broker-outage test needs a private one")
    database_url, _ = faults_stack_urls
    redis = PrivateRedis(tmp_path)
    redis.start()
    try:
        with Stack(database_url, redis.url, ENV, log_dir=tmp_path, celery_concurrency=1,
                   fresh_database=True, drop_database_on_stop=True) as stack:
            stack.manage("seed_demo")
            yield stack, redis
    finally:
        redis.crash()


def reserve_eta_probe(stack: Stack, broker_url: str) -> int:
    """Sends a drain tick due in a minute (harmless: beat sends one every second) and waits until
    the worker has reserved it. Until then it holds the message unacknowledged, so Redis dies with
    a delivery outstanding; returns the worker log's size at that point."""
    from celery import Celery

    sender = Celery("faults-eta-probe", set_as_current=False)
    try:
        with sender.connection_for_write(broker_url) as conn:
            task_id = sender.send_task("nodes.tasks.drain_tick", countdown=60, connection=conn).id
    finally:
        sender.close()
    log = stack.procs["worker"].log_path
    wait_until(lambda: f"[{task_id}] received" in log.read_text(errors="replace"), 15,
               "the Celery worker to reserve the ETA probe", interval=0.05, on_timeout=stack.diagnostics)
    return log.stat().st_size


def test_fault_broker_down_while_pauses_and_webhooks_arrive(outage, fault_report) -> None:
    stack, redis = outage
    token = stack.api().post("/api/v1/auth/token", json=OWNER).json()["token"]
    api = stack.api(token, timeout=30)
    model = sql(stack, "SELECT name FROM nodes_servedmodel ORDER BY id LIMIT 1")[0]["name"]
    router = held_router(stack)
    # Half wait on a request until their deadline, half could stop at once.
    nodes = [
        spot_node_with_worker(stack, api, model, f"outage-{i}", hold_for=router if i % 2 else None)
        for i in range(PAUSES + WEBHOOKS)
    ]

    worker = stack.procs["worker"]
    log_at_crash = reserve_eta_probe(stack, redis.url)
    redis.crash()
    down_at = time.monotonic()
    answers: list[int] = []
    slowest = 0.0
    for node_id, _ in nodes[:PAUSES]:
        t = time.monotonic()
        response = api.post(f"/api/v1/nodes/{node_id}/pause")
        slowest = max(slowest, time.monotonic() - t)
        answers.append(response.status_code)
        assert response.status_code == 202, f"pause with the broker down answered {response.status_code}: {response.text[:300]}"
    for node_id, _ in nodes[PAUSES:]:
        body = json.dumps({"event_id": f"evt-{uuid.uuid4()}", "node_id": node_id, "action": "terminate"}).encode()
        t = time.monotonic()
        response = stack.api(timeout=30).post(
            "/api/v1/preemption/generic", content=body,
            headers={"X-Signature": sign(body, secret=SECRET), "content-type": "application/json"},
        )
        slowest = max(slowest, time.monotonic() - t)
        answers.append(response.status_code)
        assert response.status_code in (200, 202), f"webhook with the broker down answered {response.status_code}: {response.text[:300]}"

    worker_ids = [w for _, w in nodes]
    node_ids = [n for n, _ in nodes]
    # Committed although nothing could be enqueued.
    assert sql(stack, "SELECT count(*) AS n FROM nodes_node WHERE id = ANY(%s) AND workload_enabled", (node_ids,))[0]["n"] == 0
    assert sql(stack, "SELECT count(DISTINCT node_id) AS n FROM nodes_reclaim WHERE node_id = ANY(%s)", (node_ids,))[0]["n"] == len(nodes)
    statuses = Counter(r["status"] for r in sql(stack, "SELECT status FROM nodes_worker WHERE id = ANY(%s::uuid[])", (worker_ids,)))
    assert set(statuses) <= {"draining", "stopped"}, statuses
    time.sleep(1.0)
    outage_s = time.monotonic() - down_at
    redis.start()
    back_at = time.monotonic()

    def all_stopped() -> bool:
        # The worker must ride the outage out: if it exits, fail at once with its log.
        assert worker.alive() and stack.procs.get("worker") is worker, (
            f"the Celery worker exited ({worker.popen.returncode}) during the Redis outage:\n{worker.log_tail(80)}"
        )
        rows = sql(stack, "SELECT count(*) AS n FROM nodes_worker WHERE id = ANY(%s::uuid[]) AND status = 'stopped'", (worker_ids,))
        return rows[0]["n"] == len(worker_ids)

    wait_until(all_stopped, 45, "every drain to finish once Redis is back", interval=0.2, on_timeout=stack.diagnostics)
    recovered_s = time.monotonic() - back_at
    time.sleep(1.5)
    stops = Counter(
        str(r["worker_id"])
        for r in sql(stack, "SELECT worker_id FROM nodes_command WHERE kind = 'stop_worker' AND worker_id = ANY(%s::uuid[])", (worker_ids,))
    )
    assert stops == Counter({w: 1 for w in worker_ids}), stops
    unfinished = sql(stack, "SELECT id FROM nodes_reclaim WHERE node_id = ANY(%s) AND finished_at IS NULL", (node_ids,))
    assert unfinished == []
    # The same process, still running, noticed the loss, reconnected and went on consuming.
    assert worker.alive() and stack.procs["worker"] is worker, worker.log_tail(80)
    with open(worker.log_path, "rb") as f:
        f.seek(log_at_crash)
        since_crash = f.read().decode(errors="replace")
    assert "Unrecoverable error" not in since_crash, since_crash[-4000:]
    assert "Connection to broker lost" in since_crash, since_crash[-4000:]
    reconnected = since_crash.split("Connection to broker lost", 1)[1]
    assert "Connected to " in reconnected, since_crash[-4000:]
    ran_after = reconnected.split("Connected to ", 1)[1].count(" succeeded in ")
    assert ran_after > 0, since_crash[-4000:]
    fault_report(
        f"fault: broker down: {PAUSES} pauses + {WEBHOOKS} webhooks = {len(answers)} trials during a {outage_s:.1f} s Redis outage "
        f"(answers {sorted(Counter(answers).items())}, slowest {slowest:.2f} s), all committed; every drain finished "
        f"{recovered_s:.1f} s after Redis returned, 1 stop command each; the Celery worker (holding an unacked "
        f"message when Redis died) stayed up, reconnected and ran {ran_after} task(s) after, 0 restarts"
    )
