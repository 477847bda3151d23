"""Deadline adherence: drains whose last request never ends are stopped at their deadline, not later.

DRAINS spot nodes each hold one router slot that is never released; they are
paused one after another, spread over SPREAD_S seconds, with a short ceiling
(DRAIN_CEILING_S, for the Celery processes and this process alike). Only the
drain tick (Celery beat, every DRAIN_TICK_S) can stop them, at or after the
deadline. Lateness is measured from each worker's drain_deadline to
worker.stopped_at (the decision) and to the stop_worker Command's created_at
(what the agent will be told).
"""

from __future__ import annotations

import os
import time

from bench import (
    CHILD_ENV,
    bench_broker_url,
    fresh_database,
    headline,
    log_dir,
    nodes_with_a_held_slot,
    setup_django,
    summary,
    table,
)
from simulator.stack import Stack

CEILING_S = 3.0
DRAINS = int(os.environ.get("BENCH_DEADLINE_DRAINS", "200"))
SPREAD_S = float(os.environ.get("BENCH_DEADLINE_SPREAD_S", "4"))
TARGET_LATE_S = 1.0


def run() -> str:
    started = time.monotonic()
    setup_django()
    from django.conf import settings
    from django.test.utils import override_settings

    from nodes.models import Command, CommandKind, Worker, WorkerStatus
    from nodes.services import pause_node

    database_url = fresh_database()
    env = {**CHILD_ENV, "DRAIN_CEILING_S": CEILING_S}
    # This process starts the drains, so it computes their deadlines: same ceiling.
    with override_settings(DRAIN_CEILING_S=CEILING_S), Stack(
        database_url, bench_broker_url(), env, processes=("worker", "beat"), log_dir=log_dir("deadline")
    ):
        held = nodes_with_a_held_slot(DRAINS, tag="deadline")
        worker_ids = [worker_id for _, worker_id, _ in held]
        begin = time.monotonic()
        for i, (node_id, _, _) in enumerate(held):
            pause_at = begin + i * SPREAD_S / max(DRAINS - 1, 1)
            time.sleep(max(pause_at - time.monotonic(), 0))
            pause_node(node_id=node_id)
        paused_s = time.monotonic() - begin
        workers = Worker.objects.filter(pk__in=worker_ids)
        wait_until = time.monotonic() + CEILING_S + 30
        while workers.exclude(status=WorkerStatus.STOPPED).exists() and time.monotonic() < wait_until:
            time.sleep(0.2)
        rows = list(workers.values_list("pk", "status", "stop_reason", "drain_deadline", "stopped_at"))
        commands = dict(
            Command.objects.filter(worker_id__in=worker_ids, kind=CommandKind.STOP_WORKER).values_list("worker_id", "created_at")
        )
    stopped = [r for r in rows if r[1] == WorkerStatus.STOPPED]
    decision = [(r[4] - r[3]).total_seconds() for r in stopped]
    command = [(commands[r[0]] - r[3]).total_seconds() for r in stopped if r[0] in commands]
    late = sum(1 for s in command if s > TARGET_LATE_S)
    early = sum(1 for s in decision if s < 0)
    ceiling = sum(1 for r in stopped if r[2] == "ceiling")
    d, c = summary(decision), summary(command)
    headline("deadline", "drains stopped", len(stopped), f"of {DRAINS}", target=f"all {DRAINS}", met=len(stopped) == DRAINS)
    headline("deadline", "stop_worker command after the deadline, p99", c["p99"], "s")
    headline("deadline", f"stop_worker commands more than {TARGET_LATE_S:g} s late", late,
             target=f"0 over {TARGET_LATE_S:g} s", met=late == 0)
    return table(
        f"Deadline adherence: {DRAINS} drains that never reach zero slots, ceiling {CEILING_S:g} s, paused over {paused_s:.1f} s",
        ["lateness after drain_deadline", "p50 s", "p99 s", "max s", "> 1 s late", "target"],
        [
            ["worker.stopped_at", d["p50"], d["p99"], d["max"], sum(1 for s in decision if s > TARGET_LATE_S), "0 over 1 s"],
            ["stop_worker Command.created_at", c["p50"], c["p99"], c["max"], late, "0 over 1 s"],
        ],
        [
            f"{'meets' if late == 0 and len(stopped) == DRAINS else 'MISSES'} the target: "
            f"{len(stopped)}/{DRAINS} stopped ({ceiling} at the ceiling), {late} commanded more than {TARGET_LATE_S:g} s late, "
            f"{early} before their deadline",
            "each drain's finish_drain task is due at its deadline (Celery ETA); the drain tick "
            f"(every {settings.DRAIN_TICK_S:g} s) is the backstop if that message is lost",
            f"Celery worker (prefork, concurrency 2) and beat; benchmark {time.monotonic() - started:.0f} s",
        ],
    )


if __name__ == "__main__":
    print(run())
