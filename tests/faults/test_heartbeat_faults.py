"""Faults on the heartbeat path (R7): a storm racing a pause, dropped beats, a fleet gone stale."""

from __future__ import annotations

import logging
import random
import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.conf import settings
from django.db import connections
from django.utils import timezone

from marketplace import pg
from nodes.heartbeats import PG_HEARTBEAT_SQL, expire_workers, heartbeat, heartbeat_params, heartbeat_reply
from nodes.models import Node, Worker, WorkerStatus
from nodes.services import pause_node
from nodes.slots import acquire_slot, router_heartbeat
from tests.factories import make_node, make_ready_worker

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

REPETITIONS = 50
THREADS = 10
BEATS = 50  # per thread and repetition: 500 heartbeats each time
ORM_EVERY = 5  # in every fifth repetition one thread goes through the reference heartbeat() (slower) instead


def test_fault_heartbeat_storm_racing_a_pause_never_makes_the_worker_ready_again(owner, model, fault_report):
    rng = random.Random(8)
    router_heartbeat(instance_id="r1")
    connections_ = [psycopg.connect(pg.conninfo(), **pg.FAST_CONN_KWARGS) for _ in range(THREADS)]
    sent = after_pause = 0
    started = time.monotonic()
    try:
        for rep in range(REPETITIONS):
            node, _ = make_node(provider=owner, is_spot=True)
            worker = make_ready_worker(node, model=model)
            held = rep % 2 == 0  # half the drains wait on a request (draining), half stop at once (stopped)
            if held:
                acquire_slot(worker_id=worker.pk, router_instance="r1")
            initial = WorkerStatus.STARTING if rep % 4 < 2 else WorkerStatus.READY
            Worker.objects.filter(pk=worker.pk).update(status=initial)
            report = [{"id": worker.pk, "status": "ready"}]
            params = heartbeat_params(node_id=node.pk, workers=report)
            paused = threading.Event()
            barrier = threading.Barrier(THREADS + 1)
            seen: list[list[str]] = [[] for _ in range(THREADS)]
            errors: list[BaseException] = []
            pause_delay = rng.uniform(0, 0.05)

            def beater(i: int) -> None:
                try:
                    barrier.wait()
                    for _ in range(BEATS):
                        began_after = paused.is_set()
                        if i == 0 and rep % ORM_EVERY == 0:
                            status = heartbeat(node=node, workers=report)["workers"][0]["status"]
                        else:
                            rows = connections_[i].execute(PG_HEARTBEAT_SQL, params).fetchall()
                            status = heartbeat_reply(rows, report)["workers"][0]["status"]
                        if began_after:
                            seen[i].append(status)
                except BaseException as exc:  # collected and asserted below
                    errors.append(exc)
                finally:
                    connections.close_all()

            def pauser() -> None:
                try:
                    barrier.wait()
                    time.sleep(pause_delay)
                    pause_node(node_id=node.pk)
                    paused.set()
                except BaseException as exc:
                    errors.append(exc)
                finally:
                    connections.close_all()

            threads = [threading.Thread(target=beater, args=(i,)) for i in range(THREADS)] + [threading.Thread(target=pauser)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=30)
            assert errors == [], f"repetition {rep}: {errors!r}"
            statuses = {s for per_thread in seen for s in per_thread}
            expected = {WorkerStatus.DRAINING} if held else {WorkerStatus.STOPPED}
            assert statuses <= expected, f"repetition {rep}: answered {statuses} after the pause committed"
            worker.refresh_from_db()
            assert worker.status == (WorkerStatus.DRAINING if held else WorkerStatus.STOPPED), f"repetition {rep}"
            # One more beat, after everything: the platform's word stands.
            assert heartbeat(node=node, workers=report)["workers"][0]["status"] == worker.status
            sent += THREADS * BEATS
            after_pause += sum(len(s) for s in seen)
    finally:
        for conn in connections_:
            conn.close()
    elapsed = time.monotonic() - started
    fault_report(
        f"fault: heartbeat storm vs pause: {REPETITIONS} trials x {THREADS * BEATS} heartbeats = {sent} heartbeats "
        f"({after_pause} began after the pause committed, none answered ready), {elapsed:.1f} s"
    )


FLEET = 100
DROPPED_FLEET = 50


def _fleet(owner, model, n: int) -> list[Worker]:
    workers = []
    for _ in range(n):
        node, _ = make_node(provider=owner)
        workers.append(make_ready_worker(node, model=model))
    return workers


def test_fault_dropped_heartbeats_shorter_than_the_expiry_never_mark_a_worker_lost(owner, model, fault_report):
    """Each worker misses a random run of beats, its gap always < WORKER_EXPIRY_S; the guard runs every tick."""
    rng = random.Random(5)
    workers = _fleet(owner, model, DROPPED_FLEET)
    nodes = {w.pk: Node.objects.get(pk=w.node_id) for w in workers}
    interval = settings.HEARTBEAT_INTERVAL_S
    expiry = settings.WORKER_EXPIRY_S
    max_missed = int(expiry // interval) - 2  # the longest gap stays a full beat under the expiry
    assert max_missed >= 1
    t0 = timezone.now()
    for w in workers:
        heartbeat(node=nodes[w.pk], workers=[{"id": w.pk, "status": "ready"}], now=t0)
    last_beat = {w.pk: t0 for w in workers}
    skip_until = {w.pk: 0 for w in workers}
    ticks, dropped, guard_runs, longest_gap = 50, 0, 0, 0.0
    for tick in range(1, ticks + 1):
        now = t0 + timedelta(seconds=tick * interval)
        for w in workers:
            if tick < skip_until[w.pk]:
                dropped += 1
                continue
            if tick > skip_until[w.pk] and rng.random() < 0.3:  # start dropping a run of beats (not the beat ending one)
                skip_until[w.pk] = tick + rng.randint(1, max_missed)
                dropped += 1
                continue
            heartbeat(node=nodes[w.pk], workers=[{"id": w.pk, "status": "ready"}], now=now)
            longest_gap = max(longest_gap, (now - last_beat[w.pk]).total_seconds())
            last_beat[w.pk] = now
        # The guard runs after each tick, at the tick's instant (one tick late, the worst case).
        report = expire_workers(now=now)
        guard_runs += 1
        assert report == {"lost": 0, "held": False}, f"tick {tick}: {report}"
    assert longest_gap < expiry
    assert Worker.objects.filter(pk__in=[w.pk for w in workers], status=WorkerStatus.READY).count() == DROPPED_FLEET
    fault_report(
        f"fault: dropped heartbeats (gaps < {expiry:g} s expiry): {DROPPED_FLEET} workers x {ticks} ticks = {DROPPED_FLEET * ticks} trials, "
        f"{dropped} beats dropped, longest gap {longest_gap:g} s, {guard_runs} guard runs, 0 lost"
    )


def test_fault_more_than_half_the_fleet_stale_alerts_and_waits(owner, model, caplog, fault_report):
    workers = _fleet(owner, model, FLEET)
    now = timezone.now() + timedelta(seconds=settings.WORKER_EXPIRY_S + 1)
    ids = [w.pk for w in workers]
    trials = 0
    for stale_n in (51, 75, 100):
        Worker.objects.filter(pk__in=ids).update(expires_at=now + timedelta(minutes=5))
        Worker.objects.filter(pk__in=ids[:stale_n]).update(expires_at=now - timedelta(seconds=1))
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="nodes.heartbeats"):
            report = expire_workers(now=now)
        assert report == {"lost": 0, "held": True, "stale": stale_n, "total": FLEET}
        assert any("mass_stale_alert" in r.getMessage() and f"stale={stale_n} of {FLEET}" in r.getMessage() for r in caplog.records)
        assert Worker.objects.filter(pk__in=ids, status=WorkerStatus.READY).count() == FLEET
        trials += 1
    # Exactly half is not "more than half": those are marked lost, one by one.
    Worker.objects.filter(pk__in=ids).update(expires_at=now + timedelta(minutes=5))
    Worker.objects.filter(pk__in=ids[:50]).update(expires_at=now - timedelta(seconds=1))
    assert expire_workers(now=now) == {"lost": 50, "held": False}
    assert Worker.objects.filter(pk__in=ids, status=WorkerStatus.LOST).count() == 50
    trials += 1
    fault_report(
        f"fault: mass staleness: {trials} trials on a {FLEET}-worker fleet (51/75/100 stale: alert logged, 0 lost; "
        f"50 stale: 50 lost)"
    )
