"""Faults at the node's edge: a stop the agent never acknowledges, a broker that refuses a message.

In-process on PostgreSQL. The stop is delivered in every heartbeat reply (the
reference heartbeat() and the one-statement fast path alike) and after an
agent restart (hello), until the agent acks it; then never again.
"""

from __future__ import annotations

import logging
import time

import psycopg
import pytest
from kombu.exceptions import OperationalError

from marketplace import pg
from nodes import tasks
from nodes.commands import ack_command
from nodes.heartbeats import PG_HEARTBEAT_SQL, heartbeat, heartbeat_params, heartbeat_reply, hello
from nodes.models import Command, Node, Reclaim, Worker, WorkerStatus
from nodes.services import pause_node
from tests.factories import make_node, make_ready_worker

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

NODES, BEATS = 10, 20


def test_fault_an_unacked_stop_is_resent_in_every_reply_until_acked(owner, model, fault_report):
    started = time.monotonic()
    deliveries = 0
    with psycopg.connect(pg.conninfo(), **pg.FAST_CONN_KWARGS) as conn:
        for i in range(NODES):
            node, _ = make_node(provider=owner, is_spot=True)
            worker = make_ready_worker(node, model=model)
            pause_node(node_id=node.pk)  # nothing in flight: stopped at once, stop_worker issued
            [stop] = Command.objects.filter(worker=worker, kind="stop_worker")
            report = [{"id": worker.pk, "status": "ready"}]  # the agent still runs it and says so
            params = heartbeat_params(node_id=node.pk, workers=report)
            for beat in range(BEATS):
                if beat % 2 == 0:
                    reply = heartbeat(node=Node.objects.get(pk=node.pk), workers=report)
                else:
                    reply = heartbeat_reply(conn.execute(PG_HEARTBEAT_SQL, params).fetchall(), report)
                kinds = [(c["id"], c["kind"]) for c in reply["commands"]]
                assert (str(stop.pk), "stop_worker") in kinds, f"node {i} beat {beat}: {kinds}"
                assert reply["workers"][0]["status"] == WorkerStatus.STOPPED
            # An agent that restarted (and forgot what it was told) gets it again in hello.
            again = hello(node=Node.objects.get(pk=node.pk), hardware={}, cloud={}, running_worker_ids=[str(worker.pk)])
            assert str(stop.pk) in [c["id"] for c in again["commands"]]
            stop.refresh_from_db()
            assert stop.delivery_count == BEATS + 1 and stop.acked_at is None
            deliveries += stop.delivery_count
            ack_command(node=node, command_id=stop.pk, ok=True, detail="stopped, exit code -9")
            ack_command(node=node, command_id=stop.pk, ok=True, detail="a repeated ack")  # harmless
            for _ in range(3):
                reply = heartbeat(node=Node.objects.get(pk=node.pk), workers=report)
                assert str(stop.pk) not in [c["id"] for c in reply["commands"]]
                fast = heartbeat_reply(conn.execute(PG_HEARTBEAT_SQL, params).fetchall(), report)
                assert str(stop.pk) not in [c["id"] for c in fast["commands"]]
            stop.refresh_from_db()
            assert stop.delivery_count == BEATS + 1 and stop.detail == "stopped, exit code -9"
            assert Command.objects.filter(worker=worker, kind="stop_worker").count() == 1
    fault_report(
        f"fault: stop never acked: {NODES} trials x {BEATS} heartbeats + 1 hello = {deliveries} deliveries of the same "
        f"stop (orm and fast path), 0 after the ack, {time.monotonic() - started:.1f} s"
    )


def test_fault_a_broker_refusing_messages_does_not_undo_or_fail_a_pause(owner, model, monkeypatch, caplog, fault_report):
    """on_commit enqueues that raise (the broker is down) are logged; the pause stands and recovery finishes it."""

    def refuse(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(tasks.finish_drain_task, "delay", refuse)
    monkeypatch.setattr(tasks.finish_drain_task, "apply_async", refuse)
    monkeypatch.setattr(tasks.place_replacement_task, "delay", refuse)
    trials = 5
    nodes = []
    with caplog.at_level(logging.WARNING, logger="marketplace.enqueue"):
        for _ in range(trials):
            node, _ = make_node(provider=owner, is_spot=True)
            make_ready_worker(node, model=model)
            paused, reclaim = pause_node(node_id=node.pk)  # raised OperationalError after the commit before the fix
            assert paused.workload_enabled is False and reclaim is not None
            nodes.append(node.pk)
    failed = [r for r in caplog.records if r.getMessage().startswith("enqueue_failed")]
    assert len(failed) >= trials  # at least the finish of each drained worker
    assert Worker.objects.filter(node_id__in=nodes, status=WorkerStatus.DRAINING).count() == trials
    from nodes.recovery import run_recovery

    assert run_recovery()["drains_finished"] == trials
    assert Worker.objects.filter(node_id__in=nodes, status=WorkerStatus.STOPPED).count() == trials
    assert Reclaim.objects.filter(node_id__in=nodes, finished_at__isnull=True).count() == 0
    assert Command.objects.filter(node_id__in=nodes, kind="stop_worker").count() == trials
    fault_report(
        f"fault: broker refuses every enqueue: {trials} trials (pauses), all committed without raising, "
        f"{len(failed)} enqueue_failed warnings, recovery finished every drain once"
    )
