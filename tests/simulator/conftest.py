"""Fixtures for the simulator tests: no Django, no database.

FakePlane is a tiny stand-in for the platform's agent API. It is reachable
in-process (httpx.MockTransport) or over a real port (uvicorn in a thread)
for tests that run the agent as a separate process.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from simulator.agent import Agent
from simulator.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
AGENT_TOKEN = "agent-secret"


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Polls with a short interval; fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def pid_alive(pid: int) -> bool:
    """False once the process is gone or a zombie (a container's PID 1 may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


class FakePlane:
    """The agent API, reduced to what the agent needs; records every call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, Any, str | None]] = []  # (path, body, authorization)
        self.commands: dict[Any, dict[str, Any]] = {}  # delivered until acked, like the platform
        self.status_override: dict[str, str] = {}
        self.registration_status = "ready"
        self.fail_acks = 0
        self.interval = 5.0
        self._ids = itertools.count(1)

    def send(self, kind: str, payload: dict[str, Any], cid: Any = None) -> dict[str, Any]:
        command = {"id": next(self._ids) if cid is None else cid, "kind": kind, "payload": payload}
        with self.lock:
            self.commands[command["id"]] = command
        return command

    def bodies(self, suffix: str) -> list[Any]:
        with self.lock:
            return [body for path, body, _ in self.calls if path.endswith(suffix)]

    def acks(self, cid: Any) -> list[dict[str, Any]]:
        return self.bodies(f"/commands/{cid}/ack")

    def reply(self, path: str, body: Any, auth: str | None) -> tuple[int, Any]:
        with self.lock:
            self.calls.append((path, body, auth))
            if auth != f"Bearer {AGENT_TOKEN}":
                return 401, {"code": "unauthorized", "detail": "Bad agent token."}
            pending = list(self.commands.values())
            if path == "/api/v1/agent/hello":
                return 200, {"node_id": 1, "heartbeat_interval_s": self.interval, "commands": pending}
            if path == "/api/v1/agent/heartbeat":
                workers = [
                    {"id": w["id"], "status": self.status_override.get(str(w["id"]), w["status"]), "expires_at": None}
                    for w in body["workers"]
                ]
                return 200, {"workers": workers, "commands": pending, "heartbeat_interval_s": self.interval}
            if path == "/api/v1/agent/workers":
                return 201, {"id": body["worker_id"], "status": self.registration_status}
            if path.endswith("/ack"):
                if self.fail_acks:
                    self.fail_acks -= 1
                    return 500, {"code": "server_error", "detail": "Try again."}
                cid = path.split("/")[-2]
                self.commands = {k: v for k, v in self.commands.items() if str(k) != cid}
                return 200, {}
        return 404, {"code": "not_found", "detail": "No such path."}

    def mock_transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content) if request.content else None
            status, reply = self.reply(request.url.path, body, request.headers.get("authorization"))
            return httpx.Response(status, json=reply)

        return httpx.MockTransport(handler)

    def asgi_app(self) -> Starlette:
        async def endpoint(request: Request) -> JSONResponse:
            raw = await request.body()
            status, reply = self.reply(
                request.url.path, json.loads(raw) if raw else None, request.headers.get("authorization")
            )
            return JSONResponse(reply, status_code=status)

        return Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST"])])


@pytest.fixture
def sim() -> SimpleNamespace:
    """Helpers for the test modules (importing conftest by name is fragile)."""
    return SimpleNamespace(
        wait=wait_until, pid_alive=pid_alive, answers=answers, env=subprocess_env, root=ROOT, token=AGENT_TOKEN
    )


@pytest.fixture
def plane() -> FakePlane:
    return FakePlane()


@pytest.fixture
def plane_url(plane: FakePlane) -> Iterator[str]:
    """The fake plane on a real port, for agents running as processes."""
    port = free_port()
    config = uvicorn.Config(plane.asgi_app(), host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "fake plane to listen")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(5)


@pytest.fixture
def make_agent(plane: FakePlane) -> Iterator[Callable[..., Agent]]:
    """Agents talking to the in-process fake plane; shut down after the test."""
    agents: list[Agent] = []

    def make(**kwargs: Any) -> Agent:
        kwargs.setdefault("stop_grace_s", 2.0)
        client = httpx.Client(transport=plane.mock_transport())
        agent = Agent("http://plane.test", AGENT_TOKEN, client=client, **kwargs)
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        agent.shutdown()


@pytest.fixture
def start_model_server() -> Iterator[Callable[..., tuple[subprocess.Popen[bytes], str]]]:
    """Runs `python -m simulator.model_server` on a free port; killed afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str, model: str = "sim-model") -> tuple[subprocess.Popen[bytes], str]:
        port = free_port()
        argv = [sys.executable, "-m", "simulator.model_server", "--port", str(port), "--model", model, *args]
        proc = subprocess.Popen(argv, cwd=ROOT, env=subprocess_env())
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: proc.poll() is not None or answers(f"{url}/healthz"), 15, "model server to answer")
        assert proc.poll() is None, f"model server exited with {proc.returncode}"
        return proc, url

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
