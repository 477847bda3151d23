"""Helpers of the router e2e tests (test_router_e2e.py): the router over the wire, on real processes.

The tests play the node agent themselves: they start `python -m simulator.model_server`
processes, register them as workers with the node's agent token
(`POST /api/v1/agent/workers`) and keep them alive with heartbeats from a thread.
That gives any number of workers per node, at any token rate, with endpoints the
test controls (a dead port, a process to SIGKILL), which the reference agent's
one-worker-per-node placement does not.

Each test uses a served model of its own (created here with plain SQL: the API
has no endpoint for served models), so the router never sends one test's
request to another test's worker while the tests share one stack.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
from psycopg.rows import dict_row

from simulator.procs import free_port
from simulator.stack import Proc, Stack, WebProc, wait_until

# The stack's clocks for these tests (ARCHITECTURE.md, "Timing defaults", scaled down).
# DRAIN_CEILING_S is the main web process's: long enough that a stream which can
# finish always does, even with two cores busy with 200 streams. A test that
# needs a short ceiling pauses through a web process of its own (SHORT_CEILING_S).
ROUTER_E2E_ENV = {
    "HEARTBEAT_INTERVAL_S": 1,
    "DRAIN_CEILING_S": 20,
    "STOP_GRACE_S": 2,
    "DRAIN_TICK_S": 1,
    # A router that stops beating is dead after 3 s; the guard looks every second.
    "ROUTER_EXPIRY_S": 3,
    "HEARTBEAT_GUARD_S": 1,
    # A served model created by a test is seen by every router within a second.
    "ROUTER_MODEL_CACHE_S": 1,
    "LOG_LEVEL": "INFO",
}
SHORT_CEILING_S = 4.0
# Extra web processes share PostgreSQL's 100 connections with the rest of the stack.
SMALL_WEB_POOLS = {"ROUTER_DB_POOL": 4, "DB_POOL_MAX": 4, "AGENT_FASTPATH_POOL": 2}


@dataclass
class ModelServer:
    proc: Proc
    endpoint: str


@dataclass
class StreamResult:
    """One streaming completion as the client saw it."""

    request_id: str
    status: int = 0
    body: bytes = b""
    worker_id: str | None = None
    transport_error: str | None = None  # the connection broke (httpx error), not an SSE error event
    ended_at: float = 0.0  # time.monotonic() when the body ended

    @property
    def done(self) -> bool:
        return b"data: [DONE]" in self.body

    @property
    def events(self) -> list[Any]:
        """The JSON payloads of the SSE `data:` lines ([DONE] left out)."""
        out = []
        for line in self.body.split(b"\n"):
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                out.append(json.loads(line[6:]))
        return out

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [e["error"] for e in self.events if isinstance(e, dict) and "error" in e]

    @property
    def tokens(self) -> int:
        """Content tokens received (the fake model's are "tok0", " tok1", ...)."""
        count = 0
        for event in self.events:
            for choice in event.get("choices") or () if isinstance(event, dict) else ():
                if (choice.get("delta") or {}).get("content"):
                    count += 1
        return count

    def describe(self) -> str:
        return f"{self.request_id}: status {self.status}, transport error {self.transport_error!r}, tail {self.body[-200:]!r}"


class Heartbeats:
    """The agent's heartbeat for workers the test registered: every node's workers, every interval.

    Sent from a thread with the node's agent token (API.md, Agent), so the workers
    stay unexpired however long the test runs. `forget(worker_id)` stops beating
    for one worker, as an agent whose model server died would.
    """

    def __init__(self, url: str, interval_s: float) -> None:
        self.url = url
        self.interval_s = interval_s
        self.nodes: dict[str, list[str]] = {}
        self.sent = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="e2e-heartbeats", daemon=True)

    def add(self, agent_token: str, worker_id: str) -> None:
        with self._lock:
            self.nodes.setdefault(agent_token, []).append(worker_id)
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()

    def forget(self, worker_id: str) -> None:
        with self._lock:
            for ids in self.nodes.values():
                if worker_id in ids:
                    ids.remove(worker_id)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5, trust_env=False) as client:
            while not self._stop.is_set():
                with self._lock:
                    beats = [(token, list(ids)) for token, ids in self.nodes.items()]
                for token, ids in beats:
                    body = {"workers": [{"id": i, "status": "ready", "in_flight": 0} for i in ids], "rentals": []}
                    try:
                        response = client.post(
                            "/api/v1/agent/heartbeat", json=body, headers={"Authorization": f"Bearer {token}"}
                        )
                        if response.status_code != 200:
                            self.failures.append(f"{response.status_code} {response.text[:200]}")
                        self.sent += 1
                    except httpx.HTTPError as exc:
                        self.failures.append(repr(exc))
                self._stop.wait(self.interval_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)


class DrainWatch:
    """Finds, on the database's clock, a moment by which a drain had certainly committed.

    A thread polls `SELECT ... clock_timestamp()` until every given worker reads
    `draining`. The statement's snapshot is taken before clock_timestamp() is
    evaluated, so when it shows the drain, the drain committed before that
    timestamp: `seen_at` is an upper bound of the commit, a few milliseconds late
    at most. `last_ready_at` is the last poll that still read `ready`.
    """

    def __init__(self, stack: Stack, worker_ids: Iterable[str], timeout_s: float = 30.0) -> None:
        self.stack = stack
        self.worker_ids = list(worker_ids)
        self.timeout_s = timeout_s
        self.seen_at: datetime | None = None
        self.last_ready_at: datetime | None = None
        self.polls = 0
        self.error: BaseException | None = None
        self._conn = stack.db()  # connected before the pause is sent, so the first poll is prompt
        self._thread = threading.Thread(target=self._run, name="e2e-drain-watch", daemon=True)

    def start(self) -> DrainWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        try:
            with self._conn:
                while time.monotonic() < deadline:
                    all_draining, at = self._conn.execute(
                        "SELECT bool_and(status = 'draining'), clock_timestamp() FROM nodes_worker WHERE id = ANY(%s::uuid[])",
                        (self.worker_ids,),
                    ).fetchone()
                    self.polls += 1
                    if all_draining:
                        self.seen_at = at
                        return
                    self.last_ready_at = at
                    time.sleep(0.002)
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self) -> datetime:
        self._thread.join(self.timeout_s + 5)
        if self.error is not None:
            raise self.error
        assert self.seen_at is not None, f"the workers {self.worker_ids} were never seen draining"
        return self.seen_at


class RouterE2E:
    """A test's own served model, nodes, workers and model servers on the shared stack."""

    def __init__(self, stack: Stack, owner_token: str, api_key: str) -> None:
        self.stack = stack
        self.owner_token = owner_token
        self.api = stack.api(owner_token)
        self.api_key = api_key
        self.heartbeats = Heartbeats(stack.url, float(ROUTER_E2E_ENV["HEARTBEAT_INTERVAL_S"]))
        self.servers: list[ModelServer] = []
        self.webs: list[WebProc] = []

    # --- database ------------------------------------------------------------------

    def sql(self, query: str, params: Any = ()) -> list[dict[str, Any]]:
        with self.stack.db() as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []

    def db_now(self) -> datetime:
        return self.sql("SELECT clock_timestamp() AS now")[0]["now"]

    def workers(self, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        rows = self.sql("SELECT * FROM nodes_worker WHERE id = ANY(%s::uuid[])", (list(ids),))
        return {str(r["id"]): r for r in rows}

    def slots(self, worker_ids: Iterable[str]) -> list[dict[str, Any]]:
        return self.sql("SELECT * FROM nodes_slot WHERE worker_id = ANY(%s::uuid[])", (list(worker_ids),))

    def log_rows(self, model: str) -> list[dict[str, Any]]:
        return self.sql("SELECT * FROM inference_requestlog WHERE model = %s ORDER BY admitted_at", (model,))

    def wait_log_rows(self, model: str, count: int, timeout: float = 10) -> list[dict[str, Any]]:
        """The router writes its request log in batches (ROUTER_LOG_FLUSH_S): wait for `count` rows."""
        return self.wait(lambda: (rows := self.log_rows(model)) and len(rows) >= count and rows, timeout, f"{count} request log rows for {model}")

    def wait(self, predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
        return wait_until(predicate, timeout, what, interval=interval, on_timeout=self.stack.diagnostics)

    # --- set-up ----------------------------------------------------------------------

    def served_model(self, prefix: str, *, typical_tokens_per_s: float = 20.0) -> str:
        """A served model of this test's own. min_vram_gb 1 and nodes without VRAM: placement
        never puts a worker of it anywhere (warm replacements, recovery), only the test does."""
        name = f"{prefix}-{secrets.token_hex(3)}"
        self.sql(
            "INSERT INTO nodes_servedmodel (name, min_vram_gb, typical_tokens_per_s, target_replicas,"
            " min_on_demand_replicas, max_slots) VALUES (%s, 1, %s, 1, 0, 8)",
            (name, typical_tokens_per_s),
        )
        return name

    def wait_model_listed(self, model: str, url: str | None = None) -> None:
        """Until the router at `url` lists the model (its model cache is ROUTER_MODEL_CACHE_S old at most)."""
        headers = {"Authorization": f"Bearer {self.api_key}"}

        def listed() -> bool:
            response = httpx.get(f"{url or self.stack.url}/v1/models", headers=headers, timeout=5, trust_env=False)
            assert response.status_code == 200, response.text
            return model in [m["id"] for m in response.json()["data"]]

        self.wait(listed, 10, f"the router at {url or self.stack.url} to list {model}", interval=0.2)

    def node(self, name: str, *, is_spot: bool = True) -> dict[str, Any]:
        """A node created through the API (no VRAM: placement never uses it); carries its agent_token."""
        response = self.api.post(
            "/api/v1/nodes", json={"name": f"{name}-{secrets.token_hex(3)}", "is_spot": is_spot, "price_per_hour": "1.00"}
        )
        assert response.status_code == 201, response.text
        return response.json()

    def model_server(self, model: str, *, tokens_per_s: float) -> ModelServer:
        port = free_port()
        proc = self.stack.start_process(
            "model-server",
            [sys.executable, "-m", "simulator.model_server", "--host", "127.0.0.1", "--port", str(port),
             "--model", model, "--tokens-per-s", str(tokens_per_s)],
        )
        server = ModelServer(proc, f"http://127.0.0.1:{port}")
        self.servers.append(server)

        def healthy() -> bool:
            assert proc.alive(), f"model server exited: {proc.log_tail()}"
            try:
                return httpx.get(f"{server.endpoint}/healthz", timeout=1, trust_env=False).status_code == 200
            except httpx.HTTPError:
                return False

        self.wait(healthy, 15, f"the model server on port {port}")
        return server

    def register_worker(self, node: dict[str, Any], model: str, endpoint: str, *, max_slots: int) -> str:
        """What an agent does once its model server is up; the worker is `ready` and heartbeated from now on."""
        with self.stack.api(node["agent_token"], scheme="Bearer") as agent:
            response = agent.post("/api/v1/agent/workers", json={"model": model, "endpoint": endpoint, "max_slots": max_slots})
        assert response.status_code == 201, response.text
        assert response.json()["status"] == "ready", response.text
        worker_id = response.json()["id"]
        self.heartbeats.add(node["agent_token"], worker_id)
        return worker_id

    def start_web(self, env: dict[str, Any]) -> WebProc:
        web = self.stack.start_web({**SMALL_WEB_POOLS, **env})
        self.webs.append(web)
        return web

    def pause(self, node_id: int, url: str | None = None) -> dict[str, Any]:
        with self.stack.api(self.owner_token, url=url) as api:
            response = api.post(f"/api/v1/nodes/{node_id}/pause")
        assert response.status_code == 202, response.text
        return response.json()

    def drain_watch(self, worker_ids: Iterable[str]) -> DrainWatch:
        return DrainWatch(self.stack, worker_ids)

    def reclaim(self, node_id: int, reclaim_id: int) -> dict[str, Any]:
        response = self.api.get(f"/api/v1/nodes/{node_id}/reclaims")
        assert response.status_code == 200, response.text
        [reclaim] = [r for r in response.json() if r["id"] == reclaim_id]
        return reclaim

    # --- the inference client ------------------------------------------------------------

    def client(self, url: str | None = None, *, connections: int = 50) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=url or self.stack.url,
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=httpx.Timeout(60, connect=10),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
            trust_env=False,
        )

    async def stream_chat(
        self, client: httpx.AsyncClient, model: str, *, max_tokens: int, request_id: str | None = None,
        first_token: asyncio.Event | None = None,
    ) -> StreamResult:
        """One `stream: true` chat completion, read to its end (or to a broken connection)."""
        result = StreamResult(request_id or f"e2e-{secrets.token_hex(8)}")
        body = {"model": model, "stream": True, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}
        chunks: list[bytes] = []
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body, headers={"x-request-id": result.request_id}) as response:
                result.status = response.status_code
                result.worker_id = response.headers.get("x-worker-id")
                async for chunk in response.aiter_raw():
                    chunks.append(chunk)
                    if first_token is not None and not first_token.is_set() and b'"content":"tok0"' in b"".join(chunks[-2:]):
                        first_token.set()
        except httpx.HTTPError as exc:
            result.transport_error = repr(exc)
        result.body = b"".join(chunks)
        result.ended_at = time.monotonic()
        return result

    async def chat(self, client: httpx.AsyncClient, model: str, *, max_tokens: int) -> httpx.Response:
        body = {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}
        return await client.post("/v1/chat/completions", json=body)

    # --- teardown --------------------------------------------------------------------------

    def close(self) -> None:
        """Heartbeats off, then every process the test started, all at once (one timeout, not one each)."""
        self.heartbeats.close()
        self.api.close()
        procs = [s.proc for s in self.servers if s.proc in self.stack.procs.values()]
        procs += [w.proc for w in self.webs if w.proc in self.stack.procs.values()]
        if procs:
            survivors = self.stack.stop_process(*procs)
            assert not survivors, f"processes survived SIGKILL: {survivors}"


@dataclass
class Timeline:
    """Moments of a test, for the failure messages and the report."""

    marks: dict[str, float] = field(default_factory=dict)
    start: float = field(default_factory=time.monotonic)

    def mark(self, name: str) -> float:
        self.marks[name] = time.monotonic() - self.start
        return self.marks[name]

    def __str__(self) -> str:
        return ", ".join(f"{k} {v:.2f}s" for k, v in self.marks.items())
