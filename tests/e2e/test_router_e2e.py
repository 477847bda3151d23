"""The router over the wire, on the real processes: web (uvicorn), Celery worker and beat, PostgreSQL, Redis.

Clients speak OpenAI's API to /v1 of a web process, the router proxies to real
model server processes, and every assertion reads what a client received or
what the platform wrote (request log, slots, workers, reclaims).

One stack for the module (router_helpers.ROUTER_E2E_ENV: 20 s drain ceiling,
router leases expiring after 3 s, heartbeat guard every second). A test that
needs other settings starts a web process of its own with them. Each test has
its own served model, nodes, workers and model servers, and stops what it
started.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from simulator.procs import free_port
from simulator.stack import Stack
from tests.e2e.conftest import OWNER, e2e_broker_url, e2e_database_url
from tests.e2e.router_helpers import ROUTER_E2E_ENV, SHORT_CEILING_S, RouterE2E, StreamResult, Timeline

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

ROUTER_EXPIRY_S = float(ROUTER_E2E_ENV["ROUTER_EXPIRY_S"])
HEARTBEAT_GUARD_S = float(ROUTER_E2E_ENV["HEARTBEAT_GUARD_S"])
CEILING_S = float(ROUTER_E2E_ENV["DRAIN_CEILING_S"])


@pytest.fixture(scope="module")
def router_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("router-e2e-logs")
    with Stack(
        e2e_database_url(), e2e_broker_url(), ROUTER_E2E_ENV, log_dir=log_dir, fresh_database=True, drop_database_on_stop=True
    ) as running:
        running.manage("seed_demo")
        yield running


@pytest.fixture(scope="module")
def owner_token(router_stack: Stack) -> str:
    with router_stack.api() as api:
        response = api.post("/api/v1/auth/token", json=OWNER)
    assert response.status_code == 200, response.text
    return response.json()["token"]


@pytest.fixture(scope="module")
def api_key(router_stack: Stack, owner_token: str) -> str:
    with router_stack.api(owner_token) as api:
        response = api.post("/api/v1/api-keys", json={"name": "router-e2e"})
    assert response.status_code == 201, response.text
    return response.json()["key"]


@pytest.fixture
def r(router_stack: Stack, owner_token: str, api_key: str) -> Iterator[RouterE2E]:
    # One INFO line per request from httpx would bury a failure's report.
    httpx_log = logging.getLogger("httpx")
    level = httpx_log.level
    httpx_log.setLevel(logging.WARNING)
    helper = RouterE2E(router_stack, owner_token, api_key)
    try:
        yield helper
    finally:
        helper.close()
        httpx_log.setLevel(level)


# --- R4 under load --------------------------------------------------------------------

N_STREAMS = 200
FIRST_WAVE = 100  # sent at once; the other 100 follow one every RAMP_S
RAMP_S = 0.015
PAUSE_AFTER = 150  # the pause goes out once this many requests are sent (~0.75 s in)
AFTER_ANSWER = 175  # from this one on, requests wait for the pause's answer: some surely come after it
TOKENS = 40
TOKENS_PER_S = 20.0  # 40 tokens take 2 s


def test_r4_no_request_reaches_a_paused_node_under_load_and_every_stream_finishes(r: RouterE2E) -> None:
    model = r.served_model("r4-load")
    servers = [r.model_server(model, tokens_per_s=TOKENS_PER_S) for _ in range(3)]
    node_a, node_b = r.node("r4-a"), r.node("r4-b")
    # Slots for every request on any one worker: a 503 (no free slot) would say nothing about R4.
    a_workers = [r.register_worker(node_a, model, s.endpoint, max_slots=N_STREAMS) for s in servers[:2]]
    b_worker = r.register_worker(node_b, model, servers[2].endpoint, max_slots=N_STREAMS)
    r.wait_model_listed(model)
    timeline = Timeline()

    def pause_node_a() -> dict:
        watch = r.drain_watch(a_workers).start()
        timeline.mark("pause_sent")
        paused = r.pause(node_a["id"])
        timeline.mark("pause_answered")
        # After the response, hence after the commit; on the database's clock.
        answered_db = r.db_now()
        return {"paused": paused, "seen_at": watch.join(), "answered_db": answered_db, "polls": watch.polls}

    async def scenario() -> tuple[list[StreamResult], dict]:
        # The requests keep arriving across the pause (a first wave, then a ramp),
        # so admissions race the drain's commit instead of all landing before it,
        # and the last 25 arrive once it is answered, however long it takes.
        async with r.client(connections=N_STREAMS + 10) as client:
            tasks, pause = [], None
            for i in range(N_STREAMS):
                if i >= FIRST_WAVE:
                    await asyncio.sleep(RAMP_S)
                if i == PAUSE_AFTER:
                    pause = asyncio.create_task(asyncio.to_thread(pause_node_a))
                if i == AFTER_ANSWER:
                    await pause
                tasks.append(asyncio.create_task(r.stream_chat(client, model, max_tokens=TOKENS, request_id=f"r4-{i:03d}")))
            timeline.mark("all_sent")
            results = await asyncio.gather(*tasks)
            timeline.mark("all_ended")
            return results, await pause

    results, pause = asyncio.run(scenario())

    # The drain's commit time, on the one clock `admitted_at` uses (PostgreSQL's):
    # the first poll that read A's workers `draining` (DrainWatch). `admitted_at`
    # is now() of the admission statement, fixed before that statement's snapshot,
    # so an admission stamped after `seen_at` saw the drain and cannot have chosen A.
    # Not the reclaim's started_at / the workers' drain_started_at: they come from
    # the web process's clock read *before* the pause takes its locks, and an
    # admission that began in between is legitimately admitted (it is counted in
    # in_flight_at_start), so they would flag correct behaviour. Not the time the
    # response reached us either: that is later by the HTTP round trip and would
    # hide a short window of wrong admissions.
    seen_at, answered_db = pause["seen_at"], pause["answered_db"]
    drain_started_at = min(w["drain_started_at"] for w in r.workers(a_workers).values())
    assert drain_started_at <= seen_at <= answered_db, (drain_started_at, seen_at, answered_db)

    rows = r.wait_log_rows(model, N_STREAMS)
    assert len(rows) == N_STREAMS
    admitted = [row for row in rows if row["admitted_at"] is not None]

    # Every stream could finish long before the deadline (2 s of tokens, a 20 s
    # ceiling): every admitted one must end with [DONE] and no error event,
    # including the ones in flight on node A when it was paused.
    # Slots are sized so that capacity never runs out (B alone could take all
    # 200), and an admission that loses a race to the drain goes to another
    # worker: every request is admitted and every stream finishes.
    rejected = [res for res in results if res.status == 503]
    assert not rejected, f"{len(rejected)} requests got 503 although B had free slots ({timeline})"
    unfinished = [
        res.describe() for res in results
        if res.status != 200 or not res.done or res.errors or res.transport_error or res.tokens != TOKENS
    ]
    assert not unfinished, f"{len(unfinished)} streams did not finish ({timeline}):\n" + "\n".join(unfinished[:5])
    assert all(row["outcome"] == "completed" and row["status_code"] == 200 and row["error_code"] == "" for row in admitted)
    assert all(row["admitted_at"] is not None for row in rows)

    late_on_a = [row for row in admitted if row["node_id"] == node_a["id"] and row["admitted_at"] >= seen_at]
    assert not late_on_a, f"{len(late_on_a)} requests admitted to paused node A after its drain committed: {late_on_a[:3]}"
    # A served before the pause, on both its workers; B kept serving after it.
    on_a = [row for row in admitted if row["node_id"] == node_a["id"]]
    assert {str(row["worker_id"]) for row in on_a} == set(a_workers)
    after_pause = [row for row in admitted if row["admitted_at"] >= seen_at]
    assert after_pause, f"no request arrived after the pause committed ({timeline})"
    assert {row["node_id"] for row in after_pause} == {node_b["id"]}
    assert {str(row["worker_id"]) for row in after_pause} == {b_worker}

    # A's drain ended by its workers running dry, not by the ceiling.
    def a_stopped() -> dict | None:
        workers = r.workers(a_workers)
        return workers if all(w["status"] == "stopped" for w in workers.values()) else None

    stopped = r.wait(a_stopped, 10, "node A's workers to stop")
    for worker in stopped.values():
        assert worker["stop_reason"] == "drained", worker
        assert worker["requests_cut"] == 0
        assert worker["stopped_at"] < worker["drain_deadline"]
    reclaim = r.wait(
        lambda: (rc := r.reclaim(node_a["id"], pause["paused"]["reclaim"]["id"]))["finished_at"] and rc, 10, "the reclaim to finish"
    )
    assert reclaim["in_flight_at_start"] > 0, "nothing was in flight on A at the pause: the test proved nothing about draining"
    assert reclaim["cut"] == 0 and reclaim["completed"] == reclaim["in_flight_at_start"]
    in_flight_at_start = reclaim["in_flight_at_start"]

    # No lease outlives its request: nodes_slot is empty (this test's or any other's).
    r.wait(lambda: not r.sql("SELECT id FROM nodes_slot"), 10, "every slot to be released")
    workers = r.workers([*a_workers, b_worker])
    assert [w["in_flight"] for w in workers.values()] == [0, 0, 0]
    assert workers[b_worker]["status"] == "ready"
    race = [row for row in on_a if drain_started_at <= row["admitted_at"] < seen_at]
    print(
        f"\nR4 load: {N_STREAMS} streams, {len(on_a)} on A ({in_flight_at_start} in flight at the pause), "
        f"{len(after_pause)} admitted after the drain committed (all on B); drain seen "
        f"{(seen_at - drain_started_at).total_seconds() * 1000:.1f} ms after its start "
        f"({pause['polls']} polls), {len(race)} admissions to A in that window; "
        f"{timeline}"
    )


# --- R4: an admission racing a drain goes to another worker, not to a 503 ------------------


def test_r4_an_admission_that_loses_the_race_to_a_drain_goes_to_another_worker(r: RouterE2E) -> None:
    model = r.served_model("r4-race")
    server = r.model_server(model, tokens_per_s=0)
    node = r.node("r4-race", is_spot=False)
    doomed = r.register_worker(node, model, server.endpoint, max_slots=10)
    other = r.register_worker(node, model, server.endpoint, max_slots=10)
    r.wait_model_listed(model)
    # `other` looks busier (a lease of a router that beats for a day), so the
    # admission's candidate is `doomed`, the least loaded.
    fake_router = f"e2e-fake-router-{secrets.token_hex(4)}"
    with r.stack.db() as conn, conn.transaction():
        conn.execute(
            "INSERT INTO nodes_routerinstance (id, started_at, last_beat_at) VALUES (%s, now(), now() + interval '1 day')",
            (fake_router,),
        )
        conn.execute(
            "INSERT INTO nodes_slot (id, worker_id, router_instance, request_id, acquired_at) VALUES (%s, %s, %s, 'busy', now())",
            (uuid.uuid4(), other, fake_router),
        )
        conn.execute("UPDATE nodes_worker SET in_flight = in_flight + 1 WHERE id = %s", (other,))

    def admission_waiting() -> bool:
        return bool(r.sql(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND query LIKE '%%INSERT INTO nodes_slot%%'"
        ))

    async def scenario() -> Any:
        async with r.client() as client:
            # The drain of `doomed`, as start_worker_drain writes it, held open
            # while the admission reaches the worker's row.
            with r.stack.db() as drain:
                with drain.transaction():
                    drain.execute("UPDATE nodes_worker SET status = 'draining', drain_started_at = now(),"
                                  " drain_deadline = now() + interval '20 seconds' WHERE id = %s", (doomed,))
                    request = asyncio.create_task(r.chat(client, model, max_tokens=4))
                    await asyncio.to_thread(r.wait, admission_waiting, 10, "the admission to wait for the drain's lock")
                # committed: the admission's re-check now finds `doomed` draining
            return await asyncio.wait_for(request, 10)

    try:
        response = asyncio.run(scenario())
        # `other` was ready with 9 free slots all along.
        assert response.status_code == 200, f"{response.status_code} {response.text}"
        assert response.headers["x-worker-id"] == other
    finally:
        with r.stack.db() as conn, conn.transaction():
            conn.execute("DELETE FROM nodes_slot WHERE router_instance = %s", (fake_router,))
            conn.execute("UPDATE nodes_worker SET in_flight = 0 WHERE id = %s", (other,))
            conn.execute("DELETE FROM nodes_routerinstance WHERE id = %s", (fake_router,))


# --- R6 over the wire ----------------------------------------------------------------------


def test_r6_a_stream_cut_at_the_drain_deadline_ends_with_worker_reclaimed(r: RouterE2E) -> None:
    model = r.served_model("r6-cut")
    server = r.model_server(model, tokens_per_s=2)  # 60 tokens would take 30 s
    node = r.node("r6-cut")
    worker = r.register_worker(node, model, server.endpoint, max_slots=4)
    # This web process handles both the stream and the pause: its drains get a 4 s ceiling.
    web = r.start_web({"DRAIN_CEILING_S": SHORT_CEILING_S})
    r.wait_model_listed(model, web.url)

    async def scenario() -> tuple[StreamResult, dict, float, float]:
        async with r.client(web.url) as client:
            first = asyncio.Event()
            stream = asyncio.create_task(r.stream_chat(client, model, max_tokens=60, first_token=first))
            await asyncio.wait_for(first.wait(), 10)
            sent = time.monotonic()
            paused = await asyncio.to_thread(r.pause, node["id"], web.url)
            answered = time.monotonic()
            return await asyncio.wait_for(stream, SHORT_CEILING_S + 10), paused, sent, answered

    result, paused, sent, answered = asyncio.run(scenario())

    row = r.workers([worker])[worker]
    assert row["drain_deadline"] - row["drain_started_at"] == timedelta(seconds=SHORT_CEILING_S)
    assert result.status == 200
    assert result.transport_error is None, result.describe()  # the router ended the response itself
    assert not result.done, result.describe()
    assert 1 <= result.tokens < 60
    assert result.errors and result.errors[0]["type"] == "stream_interrupted", result.describe()
    assert result.errors[0]["code"] == "worker_reclaimed" and result.errors[0]["message"]
    assert result.events[-1] == {"error": result.errors[0]}, "the error event must be the last word"
    # Cut at the deadline, not before (the drain gave it the whole ceiling), and
    # reported within the cut poll and a drain tick after it.
    assert result.ended_at - sent >= SHORT_CEILING_S - 0.05, f"cut {result.ended_at - sent:.2f} s after the pause was sent"
    assert result.ended_at - answered <= SHORT_CEILING_S + 2, f"cut {result.ended_at - answered:.2f} s after the pause"

    [log] = r.wait_log_rows(model, 1)
    assert log["request_id"] == result.request_id
    assert log["outcome"] == "interrupted" and log["error_code"] == "worker_reclaimed", log
    assert log["stream"] is True and str(log["worker_id"]) == worker and log["node_id"] == node["id"]
    row = r.workers([worker])[worker]
    assert row["status"] == "stopped" and row["stop_reason"] == "ceiling" and row["requests_cut"] == 1, row
    reclaim = r.wait(
        lambda: (rc := r.reclaim(node["id"], paused["reclaim"]["id"]))["finished_at"] and rc, 5, "the reclaim to finish"
    )
    assert reclaim["cut"] == 1 and reclaim["completed"] == 0
    r.wait(lambda: not r.slots([worker]), 5, "the slot to be gone")
    print(f"\nR6 cut: error event {result.ended_at - sent:.2f} s after the pause was sent, {result.tokens} tokens before it")


def test_r6_a_worker_process_killed_mid_stream_ends_with_upstream_disconnected(r: RouterE2E) -> None:
    model = r.served_model("r6-kill")
    server = r.model_server(model, tokens_per_s=2)
    node = r.node("r6-kill")
    worker = r.register_worker(node, model, server.endpoint, max_slots=4)
    r.wait_model_listed(model)

    async def scenario() -> tuple[StreamResult, float]:
        async with r.client() as client:
            first = asyncio.Event()
            stream = asyncio.create_task(r.stream_chat(client, model, max_tokens=60, first_token=first))
            await asyncio.wait_for(first.wait(), 10)
            await asyncio.to_thread(r.stack.kill_process, server.proc)
            killed = time.monotonic()
            r.heartbeats.forget(worker)  # an agent would report it gone; nobody beats for it any more
            return await asyncio.wait_for(stream, 10), killed

    result, killed = asyncio.run(scenario())

    assert result.status == 200
    assert result.transport_error is None, result.describe()
    assert not result.done, result.describe()
    assert 1 <= result.tokens < 60
    assert [e["code"] for e in result.errors] == ["upstream_disconnected"], result.describe()
    assert result.errors[0]["type"] == "stream_interrupted"
    assert result.events[-1] == {"error": result.errors[0]}
    assert result.ended_at - killed < 3, f"reported {result.ended_at - killed:.2f} s after the kill"

    [log] = r.wait_log_rows(model, 1)
    assert log["outcome"] == "interrupted" and log["error_code"] == "upstream_disconnected", log
    assert str(log["worker_id"]) == worker
    # The router handed the slot back although the answer broke.
    r.wait(lambda: not r.slots([worker]), 5, "the slot to be released")
    assert r.workers([worker])[worker]["in_flight"] == 0


# --- Leases: a router that dies ------------------------------------------------------------

N_DOOMED = 20


def test_r5_a_killed_routers_slots_are_released_and_the_drain_it_held_finishes(r: RouterE2E) -> None:
    model = r.served_model("lease")
    servers = [r.model_server(model, tokens_per_s=2) for _ in range(2)]  # 60 tokens: 30 s
    node_d, node_e = r.node("lease-d"), r.node("lease-e")
    worker_d = r.register_worker(node_d, model, servers[0].endpoint, max_slots=50)
    worker_e = r.register_worker(node_e, model, servers[1].endpoint, max_slots=50)
    web = r.start_web({})
    r.wait_model_listed(model, web.url)
    r.wait_model_listed(model)
    timeline = Timeline()

    def lease_slots() -> list[dict]:
        return r.sql("SELECT * FROM nodes_slot WHERE request_id LIKE 'lease-%%' AND worker_id = ANY(%s::uuid[])", ([worker_d, worker_e],))

    async def scenario() -> dict:
        async with r.client(web.url, connections=N_DOOMED + 5) as doomed_client, r.client() as main_client:
            doomed = [
                asyncio.create_task(r.stream_chat(doomed_client, model, max_tokens=60, request_id=f"lease-{i:02d}"))
                for i in range(N_DOOMED)
            ]
            held = await asyncio.to_thread(
                r.wait, lambda: (s := lease_slots()) and len(s) == N_DOOMED and s, 15, f"{N_DOOMED} slots held by the second web process"
            )
            assert {str(s["worker_id"]) for s in held} == {worker_d, worker_e}
            [dead_router] = {s["router_instance"] for s in held}
            # D drains with the doomed router's requests in flight: only their release can end it early.
            paused = await asyncio.to_thread(r.pause, node_d["id"])
            timeline.mark("paused")
            # One stream through the main web process, on E (D is draining): a live
            # router's lease, which the guard must leave alone. 24 tokens: 12 s.
            survivor = asyncio.create_task(r.stream_chat(main_client, model, max_tokens=24, request_id="survivor"))
            await asyncio.to_thread(
                r.wait, lambda: r.sql("SELECT 1 FROM nodes_slot WHERE request_id = 'survivor'"), 10, "the survivor's slot"
            )
            await asyncio.to_thread(r.stack.kill_process, web.proc)
            killed = time.monotonic()
            timeline.mark("killed")
            bound = ROUTER_EXPIRY_S + HEARTBEAT_GUARD_S + 3
            await asyncio.to_thread(r.wait, lambda: not lease_slots(), bound, "the dead router's slots to be released", 0.1)
            released = time.monotonic() - killed
            timeline.mark("released")
            at_release = r.workers([worker_d, worker_e])
            survivor_slots = r.sql("SELECT worker_id FROM nodes_slot WHERE request_id = 'survivor'")

            def d_stopped() -> dict | None:
                row = r.workers([worker_d])[worker_d]
                return row if row["status"] == "stopped" else None

            # Its last release enqueues the drain's finish; the drain tick (1 s) is the backstop.
            stopped_d = await asyncio.to_thread(r.wait, d_stopped, max(bound + 2 - (time.monotonic() - killed), 3), "D's drain to finish")
            drained = time.monotonic() - killed
            timeline.mark("d_stopped")
            return {
                "paused": paused, "dead_router": dead_router, "released": released, "drained": drained,
                "at_release": at_release, "survivor_slots": survivor_slots, "stopped_d": stopped_d,
                "doomed": await asyncio.gather(*doomed), "survivor": await survivor,
            }

    out = asyncio.run(scenario())

    # Within ROUTER_EXPIRY_S + a guard period (+ slack), every lease of the dead router is gone...
    assert out["released"] <= ROUTER_EXPIRY_S + HEARTBEAT_GUARD_S + 3
    assert out["at_release"][worker_d]["in_flight"] == 0
    # ...and only those: the live router's lease on E is untouched.
    assert [str(s["worker_id"]) for s in out["survivor_slots"]] == [worker_e]
    assert out["at_release"][worker_e]["in_flight"] == 1
    assert not r.sql("SELECT 1 FROM nodes_routerinstance WHERE id = %s", (out["dead_router"],))
    # D's drain ended once its slots reached zero: drained, long before its ceiling.
    stopped_d = out["stopped_d"]
    assert stopped_d["stop_reason"] == "drained" and stopped_d["requests_cut"] == 0, stopped_d
    assert stopped_d["stopped_at"] < stopped_d["drain_deadline"] - timedelta(seconds=CEILING_S / 2), stopped_d
    reclaim = r.wait(
        lambda: (rc := r.reclaim(node_d["id"], out["paused"]["reclaim"]["id"]))["finished_at"] and rc, 5, "D's reclaim to finish"
    )
    assert reclaim["cut"] == 0 and reclaim["in_flight_at_start"] > 0

    # The doomed clients lost their connection; none was told it had a whole answer.
    assert not [res.describe() for res in out["doomed"] if res.done]
    survivor = out["survivor"]
    assert survivor.status == 200 and survivor.done and not survivor.errors, survivor.describe()
    assert survivor.worker_id == worker_e
    r.wait(lambda: not r.slots([worker_d, worker_e]), 5, "every slot to be released")
    assert r.workers([worker_e])[worker_e]["in_flight"] == 0
    print(f"\nleases: dead router's {N_DOOMED} slots released {out['released']:.2f} s after the kill, D drained at {out['drained']:.2f} s; {timeline}")


# --- Failover over the wire -------------------------------------------------------------------


def test_r4_a_worker_refusing_connections_is_failed_over_without_the_client_noticing(r: RouterE2E) -> None:
    model = r.served_model("failover")
    server = r.model_server(model, tokens_per_s=200)
    node = r.node("failover", is_spot=False)
    dead = r.register_worker(node, model, f"http://127.0.0.1:{free_port()}", max_slots=50)  # nobody listens there
    live = r.register_worker(node, model, server.endpoint, max_slots=50)
    r.wait_model_listed(model)

    async def scenario() -> tuple[list[StreamResult], list]:
        async with r.client() as client:
            streams = [asyncio.create_task(r.stream_chat(client, model, max_tokens=8)) for _ in range(10)]
            wholes = [asyncio.create_task(r.chat(client, model, max_tokens=8)) for _ in range(10)]
            return await asyncio.gather(*streams), await asyncio.gather(*wholes)

    streams, wholes = asyncio.run(scenario())

    for res in streams:
        assert res.status == 200 and res.done and not res.errors and res.tokens == 8, res.describe()
        assert res.worker_id == live
    for response in wholes:
        assert response.status_code == 200, response.text
        assert response.headers["x-worker-id"] == live
        assert response.json()["choices"][0]["message"]["content"].startswith("tok0")

    rows = r.wait_log_rows(model, 20)
    assert {str(row["worker_id"]) for row in rows} == {live}
    assert {row["outcome"] for row in rows} <= {"completed", "failed_over"}
    failed_over = [row for row in rows if row["outcome"] == "failed_over"]
    assert failed_over, "the dead worker was never tried: the test proved nothing"
    assert all(row["attempts"] == 2 for row in failed_over)
    assert all(row["attempts"] == 1 for row in rows if row["outcome"] == "completed")
    r.wait(lambda: not r.slots([dead, live]), 5, "every slot to be released")
    assert [w["in_flight"] for w in r.workers([dead, live]).values()] == [0, 0]
    print(f"\nfailover: {len(failed_over)} of 20 requests tried the dead worker first")


# --- R15: the production profile with two web processes ----------------------------------


def scrape(url: str) -> dict[str, float]:
    import httpx

    values = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_r15_two_web_processes_one_pause_stops_both_and_metrics_add_up(r: RouterE2E) -> None:
    model = r.served_model("two-web")
    servers = [r.model_server(model, tokens_per_s=20) for _ in range(2)]  # 30 tokens: 1.5 s
    node_a, node_b = r.node("two-web-a"), r.node("two-web-b")
    worker_a = r.register_worker(node_a, model, servers[0].endpoint, max_slots=100)
    worker_b = r.register_worker(node_b, model, servers[1].endpoint, max_slots=100)
    second = r.start_web({})
    r.wait_model_listed(model, second.url)
    r.wait_model_listed(model)
    urls = [r.stack.url, second.url]
    before = [scrape(url) for url in urls]
    n_each = 30

    async def scenario() -> tuple[list[StreamResult], datetime]:
        async with r.client(urls[0]) as first_client, r.client(urls[1]) as second_client:
            clients = [first_client, second_client]
            early = [
                asyncio.create_task(r.stream_chat(clients[i % 2], model, max_tokens=30, request_id=f"two-web-{i:03d}"))
                for i in range(n_each)
            ]
            await asyncio.to_thread(r.wait, lambda: r.sql("SELECT 1 FROM nodes_slot WHERE worker_id = %s::uuid", (worker_a,)), 10, "a request on A")
            watch = r.drain_watch([worker_a]).start()
            await asyncio.to_thread(r.pause, node_a["id"], second.url)  # the pause goes to the second process
            seen_at = await asyncio.to_thread(watch.join)
            late = [
                asyncio.create_task(r.stream_chat(clients[i % 2], model, max_tokens=30, request_id=f"two-web-{n_each + i:03d}"))
                for i in range(n_each)
            ]
            return await asyncio.gather(*early, *late), seen_at

    results, seen_at = asyncio.run(scenario())
    assert all(res.status == 200 and res.done for res in results), [res.describe() for res in results if not res.done][:3]
    rows = r.wait_log_rows(model, 2 * n_each)
    assert {res.request_id for res in results} == {row["request_id"] for row in rows}
    # The pause, sent to one process, stopped admissions to A in both.
    late_on_a = [row for row in rows if str(row["worker_id"]) == worker_a and row["admitted_at"] >= seen_at]
    assert not late_on_a, late_on_a[:3]
    # The drain finished once: one reclaim, one stop command, stopped as drained.
    stopped = r.wait(lambda: (w := r.workers([worker_a])[worker_a])["status"] == "stopped" and w, 15, "A to stop")
    assert stopped["stop_reason"] == "drained"
    assert len(r.sql("SELECT id FROM nodes_reclaim WHERE node_id = %s", (node_a["id"],))) == 1
    assert len(r.sql("SELECT id FROM nodes_command WHERE worker_id = %s::uuid AND kind = 'stop_worker'", (worker_a,))) == 1
    r.wait(lambda: r.reclaim(node_a["id"], r.sql("SELECT id FROM nodes_reclaim WHERE node_id = %s", (node_a["id"],))[0]["id"])["finished_at"], 10, "the reclaim to finish")

    after = [scrape(url) for url in urls]
    # Database-backed figures are the same exact totals from either process.
    for key, moved in (('drains_started_total{trigger="owner_pause"}', 1), ('drains_finished_total{outcome="clean",trigger="owner_pause"}', 1)):
        for b, a in zip(before, after):
            assert a.get(key, 0) - b.get(key, 0) == moved, (key, b.get(key), a.get(key))
    assert after[0]['workers{status="stopped"}'] == after[1]['workers{status="stopped"}']
    # Per-process counters: each process served its half, and they add up to what was sent.
    served = [a.get('router_requests_total{outcome="completed"}', 0) - b.get('router_requests_total{outcome="completed"}', 0) for b, a in zip(before, after)]
    assert served == [n_each, n_each]
    assert worker_b in {str(row["worker_id"]) for row in rows if row["admitted_at"] >= seen_at}
