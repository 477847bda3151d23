"""R7 through the agent fast path: the one-statement heartbeat answers as the reference does."""

import asyncio
import threading

import httpx
import pytest
import psycopg
from django.db import connections

from marketplace import pg
from nodes.heartbeats import PG_HEARTBEAT_SQL, heartbeat_params, heartbeat_reply
from nodes.models import Command, Node, Worker, WorkerStatus
from nodes.placement import place_worker
from nodes.services import pause_node
from nodes.slots import acquire_slot, router_heartbeat
from tests.factories import make_node, make_ready_worker

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def post_heartbeats(token: str, bodies: list) -> list[httpx.Response]:
    """POST through the project's ASGI application (fast path first, Django behind it)."""
    from marketplace.asgi import AgentFastPath, django_app

    async def main() -> list[httpx.Response]:
        fastpath = AgentFastPath(fallback=django_app)
        transport = httpx.ASGITransport(app=lambda s, r, se: (fastpath if fastpath.handles(s) else django_app)(s, r, se))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
                out = []
                for body in bodies:
                    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
                    out.append(await client.post("/api/v1/agent/heartbeat", headers={"Authorization": f"Bearer {token}", "content-type": "application/json"}, **kwargs))
                return out
        finally:
            await fastpath.close()

    return asyncio.run(main())


def test_r7_fastpath_promotes_starting_and_delivers_commands(owner, model):
    node, token = make_node(provider=owner)
    worker = place_worker(node)
    body = {"workers": [{"id": str(worker.pk), "status": "ready", "in_flight": 0}], "rentals": []}
    first, second = post_heartbeats(token, [body, body])
    assert first.status_code == 200
    reply = first.json()
    assert reply["workers"][0]["status"] == "ready" and reply["workers"][0]["expires_at"].endswith("Z")
    assert [c["kind"] for c in reply["commands"]] == ["start_worker"]
    assert reply["commands"][0]["payload"] == {"worker_id": str(worker.pk), "model": model.name}
    assert second.json()["commands"] == reply["commands"]
    assert Command.objects.get().delivery_count == 2
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.READY
    assert Node.objects.get(pk=node.pk).last_seen_at is not None


def test_r7_fastpath_cannot_undo_draining_or_stopped(owner, model):
    node, token = make_node(provider=owner, is_spot=True)
    draining = make_ready_worker(node, model=model)
    stopped = make_ready_worker(node, model=model)
    router_heartbeat(instance_id="r1")
    acquire_slot(worker_id=draining.pk, router_instance="r1")
    Worker.objects.filter(pk=stopped.pk).update(status=WorkerStatus.STOPPED)
    pause_node(node_id=node.pk)
    ghost = "8f9ac2c6-7c5e-4b1d-9a70-5d0a1a1c0c01"
    body = {"workers": [{"id": str(w), "status": "ready"} for w in (draining.pk, stopped.pk, ghost)]}
    reply = post_heartbeats(token, [body])[0].json()
    assert [w["status"] for w in reply["workers"]] == ["draining", "stopped", "unknown"]
    assert reply["workers"][0]["expires_at"] is not None and reply["workers"][1]["expires_at"] is None
    assert Worker.objects.get(pk=draining.pk).status == WorkerStatus.DRAINING


def test_r14_fastpath_hands_irregular_requests_to_django(owner, model):
    node_a, token_a = make_node(provider=owner)
    node_b, _ = make_node(provider=owner)
    foreign = make_ready_worker(node_b, model=model)
    before = Worker.objects.get(pk=foreign.pk).expires_at
    foreign_reply, malformed, not_json = post_heartbeats(
        token_a, [{"workers": [{"id": str(foreign.pk), "status": "ready"}]}, {"workers": [{"id": "nope"}]}, b"{oops"]
    )
    assert foreign_reply.status_code == 403 and foreign_reply.json()["code"] == "worker_not_on_node"
    assert Worker.objects.get(pk=foreign.pk).expires_at == before
    assert malformed.status_code == 400 and "workers" in malformed.json()
    assert not_json.status_code == 400 and not_json.json()["code"] == "parse_error"
    bad = post_heartbeats("agt_nope", [{"workers": []}])[0]
    assert bad.status_code == 401 and bad.json()["code"] == "authentication_failed"


def test_r7_fastpath_statement_racing_a_pause_never_leaves_ready(owner, model):
    node, _ = make_node(provider=owner, is_spot=True)
    worker = make_ready_worker(node, model=model)
    router_heartbeat(instance_id="r1")
    acquire_slot(worker_id=worker.pk, router_instance="r1")
    Worker.objects.filter(pk=worker.pk).update(status=WorkerStatus.STARTING)
    params = heartbeat_params(node_id=node.pk, workers=[{"id": worker.pk, "status": "ready"}])
    paused = threading.Event()
    after: list[str] = []
    barrier = threading.Barrier(21)

    def beater() -> None:
        with psycopg.connect(pg.conninfo(), **pg.FAST_CONN_KWARGS) as conn:
            barrier.wait()
            for _ in range(15):
                began_after = paused.is_set()
                rows = conn.execute(PG_HEARTBEAT_SQL, params).fetchall()
                status = heartbeat_reply(rows, [{"id": worker.pk}])["workers"][0]["status"]
                if began_after:
                    after.append(status)

    def pauser() -> None:
        barrier.wait()
        pause_node(node_id=node.pk)
        paused.set()
        connections.close_all()

    threads = [threading.Thread(target=beater) for _ in range(20)] + [threading.Thread(target=pauser)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING
    assert after and set(after) == {"draining"}
