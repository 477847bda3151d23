"""Notice to router cut-off: from a cloud's webhook arriving to the last admission to its node's workers.

The router admits a request only to a `ready` worker, checked by the UPDATE
that takes the slot (R4); the cut-off is the commit that turns the node's
workers `draining`. In prod mode that commit happens inside the webhook's
request (`reclaim_node` in the notice's transaction) before the 202 is
written, so the request's round trip, as its sender sees it, bounds the
cut-off from above. After every response the bench also reads the worker row
and counts any that was not `draining` yet (there should be none).

Set-up, not measured: spot nodes with an instance id, each with a ready worker
holding one router slot (so the drain stays open and nothing else finishes
it). A real uvicorn server (one process, as `make run` starts it) and a Celery
worker on PostgreSQL and Redis, PREEMPTION_MODE=prod. Measured:

1. NOTICES signed AWS EventBridge interruption warnings, posted one at a time
   over a kept-alive connection, each for another node;
2. the same warnings again: redeliveries, answered `duplicate` (nothing new);
3. a burst: BURST notices for BURST other nodes from 8 senders at once, as when
   a cloud reclaims a whole capacity pool.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from datetime import UTC, datetime

import httpx

from bench import (
    CHILD_ENV,
    bench_broker_url,
    fresh_database,
    headline,
    log_dir,
    provider_and_model,
    setup_django,
    summary,
    table,
)
from simulator.stack import Stack

TARGET_P99_MS = 50.0
NOTICES = int(os.environ.get("BENCH_NOTICES", "200"))
BURST = int(os.environ.get("BENCH_NOTICE_BURST", "100"))
SENDERS = 8
WARMUP = 5
SECRET = "bench-webhook-secret"


def make_nodes(count: int, *, tag: str) -> list[tuple[int, str, str]]:
    """`count` spot nodes on AWS whose ready worker holds one slot; (node id, instance id, worker id)."""
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from nodes.heartbeats import register_worker
    from nodes.services import create_node
    from nodes.slots import acquire_slot, router_heartbeat

    provider, model = provider_and_model()
    router = f"bench-router-{tag}"
    router_heartbeat(instance_id=router, now=timezone.now() + timedelta(days=1))
    made = []
    for start in range(0, count, 100):
        with transaction.atomic():
            for i in range(start, min(start + 100, count)):
                instance_id = f"i-{tag}{i:05d}{uuid.uuid4().hex[:6]}"
                node, _ = create_node(
                    provider=provider, name=f"{tag}-{i}", is_spot=True, gpu_model="A100", vram_gb=80,
                    cloud="aws", instance_type="p4d.24xlarge", region="us-east-1", zone=f"us-east-1{'abcdef'[i % 6]}",
                    cloud_instance_id=instance_id,
                )
                worker = register_worker(node=node, model=model.name, endpoint=f"http://10.2.{i // 250}.{i % 250}:8000", max_slots=8)
                if acquire_slot(worker_id=worker.pk, router_instance=router, request_id=f"{tag}-{i}") is None:
                    raise RuntimeError(f"a fresh ready worker refused a slot (worker {worker.pk})")
                made.append((node.pk, instance_id, str(worker.pk)))
    return made


def warning(instance_id: str) -> bytes:
    now = datetime.now(UTC)
    return json.dumps(
        {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "account": "123456789012",
            "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": "us-east-1",
            "resources": [f"arn:aws:ec2:us-east-1a:instance/{instance_id}"],
            "detail": {"instance-id": instance_id, "instance-action": "terminate"},
        }
    ).encode()


def post(client: httpx.Client, body: bytes) -> tuple[float, dict]:
    from preemption.signing import sign

    headers = {"Content-Type": "application/json", "X-Signature": sign(body, secret=SECRET)}
    began = time.perf_counter()
    response = client.post("/api/v1/preemption/aws", content=body, headers=headers)
    elapsed_ms = (time.perf_counter() - began) * 1000
    if response.status_code != 202:
        raise RuntimeError(f"webhook answered {response.status_code}: {response.text[:300]}")
    return elapsed_ms, response.json()


def not_draining(worker_ids: list[str]) -> int:
    from nodes.models import Worker, WorkerStatus

    return Worker.objects.filter(pk__in=worker_ids).exclude(status=WorkerStatus.DRAINING).count()


def run() -> str:
    started = time.monotonic()
    setup_django()
    database_url = fresh_database()
    env = {**CHILD_ENV, "PREEMPTION_MODE": "prod", "PREEMPTION_WEBHOOK_SECRET": SECRET}
    with Stack(
        database_url, bench_broker_url(), env, processes=("web", "worker"), log_dir=log_dir("preemption")
    ) as stack:
        sequential = make_nodes(WARMUP + NOTICES, tag="seq")
        burst_nodes = make_nodes(BURST, tag="burst")
        cutoff, redelivered, floor, late = [], [], [], 0
        bodies: list[bytes] = []
        with httpx.Client(base_url=stack.url, timeout=10.0, trust_env=False) as client:
            for i in range(WARMUP + NOTICES):
                # The floor under the same conditions: a request that touches no database.
                began = time.perf_counter()
                client.get("/healthz")
                if i >= WARMUP:
                    floor.append((time.perf_counter() - began) * 1000)
            for i, (_, instance_id, worker_id) in enumerate(sequential):
                body = warning(instance_id)
                elapsed_ms, reply = post(client, body)
                if reply["action"] != "reclaimed" or reply["duplicate"]:
                    raise RuntimeError(f"unexpected reply {reply}")
                # The response came back: has the router's cut-off committed?
                late += not_draining([worker_id])
                if i >= WARMUP:  # the first requests open the server's pooled connections
                    cutoff.append(elapsed_ms)
                    bodies.append(body)
                time.sleep(random.uniform(0.005, 0.015))
            for body in bodies:
                elapsed_ms, reply = post(client, body)
                if not reply["duplicate"]:
                    raise RuntimeError(f"a redelivery did something new: {reply}")
                redelivered.append(elapsed_ms)

        burst_ms: list[float] = []
        queue = [warning(instance_id) for _, instance_id, _ in burst_nodes]
        lock = threading.Lock()
        gate = threading.Barrier(SENDERS)

        def sender() -> None:
            with httpx.Client(base_url=stack.url, timeout=30.0, trust_env=False) as client:
                gate.wait()
                while True:
                    with lock:
                        if not queue:
                            return
                        body = queue.pop()
                    elapsed_ms, _ = post(client, body)
                    with lock:
                        burst_ms.append(elapsed_ms)

        burst_began = time.perf_counter()
        threads = [threading.Thread(target=sender) for _ in range(SENDERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        burst_s = time.perf_counter() - burst_began
        burst_late = not_draining([w for _, _, w in burst_nodes])

    s, d, b, f = summary(cutoff), summary(redelivered), summary(burst_ms), summary(floor)
    headline("preemption", "signed notice -> workers draining (webhook round trip), p50", s["p50"], "ms")
    headline("preemption", "signed notice -> workers draining (webhook round trip), p99", s["p99"], "ms",
             target=f"p99 < {TARGET_P99_MS:.0f} ms", met=s["p99"] < TARGET_P99_MS)
    headline("preemption", "workers not yet draining when their 202 came back", late, f"of {len(sequential)}",
             target="0", met=late == 0)
    headline("preemption", f"burst of {BURST} notices from {SENDERS} senders, p99", b["p99"], "ms")
    return table(
        f"Notice to router cut-off: signed AWS interruption warning -> node's workers draining ({len(cutoff)} notices)",
        ["measure", "p50 ms", "p99 ms", "max ms", "mean ms", "target"],
        [
            ["webhook round trip, drain committed in it", s["p50"], s["p99"], s["max"], s["mean"], f"p99 < {TARGET_P99_MS:.0f} ms"],
            ["  the same notices redelivered (duplicate)", d["p50"], d["p99"], d["max"], d["mean"], ""],
            [f"  burst: {BURST} nodes, {SENDERS} senders at once", b["p50"], b["p99"], b["max"], b["mean"], ""],
            ["  floor: GET /healthz on the same server", f["p50"], f["p99"], f["max"], f["mean"], "comparison"],
        ],
        [
            f"{'meets' if s['p99'] < TARGET_P99_MS and late == 0 else 'MISSES'} the target: p99 {s['p99']:.1f} ms; "
            f"{late} of {len(sequential)} workers not yet draining when their 202 came back (must be 0)",
            "the cut-off is the commit of reclaim_node inside the request: the router's admission UPDATE "
            "(status = 'ready') finds no row from then on; the round trip bounds it from above",
            f"burst of {BURST} took {burst_s * 1000:,.0f} ms in all ({burst_late} workers not draining after it); "
            f"{WARMUP} warm-up notices not counted",
            "the burst queues in Django's one thread for sync views per process: more web processes shorten it",
            f"uvicorn (1 process) + Celery worker on PostgreSQL and {bench_broker_url()}; load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the end; benchmark {time.monotonic() - started:.0f} s",
        ],
    )


if __name__ == "__main__":
    print(run())
