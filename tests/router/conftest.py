"""Router tests: the /v1 ASGI app in-process, real fake model servers over HTTP."""

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from django.db import close_old_connections, connection

from inference.keys import create_api_key
from inference.router import Router
from inference.store import OrmStore, PgStore
from simulator.procs import free_port
from tests.factories import ServedModelFactory, UserFactory


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"model server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/healthz", timeout=0.5).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError("model server did not come up")


@pytest.fixture(scope="session")
def model_servers() -> Iterator[Callable[..., str]]:
    """Starts `python -m simulator.model_server` processes; returns their base URL."""
    procs: dict[tuple, tuple[subprocess.Popen, str]] = {}

    def start(model: str = "llama-3-8b", tokens_per_s: float = 0, name: str = "") -> str:
        key = (model, tokens_per_s, name)
        if key in procs:
            return procs[key][1]
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "simulator.model_server", "--port", str(port), "--model", model,
             "--tokens-per-s", str(tokens_per_s)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc)
        procs[key] = (proc, url)
        return url

    yield start
    for proc, _ in procs.values():
        proc.terminate()
    for proc, _ in procs.values():
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(params=["orm", pytest.param("pg", marks=pytest.mark.postgres)])
def store_kind(request) -> str:
    return request.param


@pytest.fixture
def router_env(transactional_db, store_kind, settings):
    """Everything a router test needs: a model, a key, and a runner for async scenarios."""
    if store_kind == "pg" and connection.vendor != "postgresql":
        pytest.skip("PgStore needs PostgreSQL")
    settings.ROUTER_KEY_CACHE_S = 0
    settings.ROUTER_CUT_POLL_S = 0.05
    settings.ROUTER_PASS_SIM_HEADERS = True
    model = ServedModelFactory(name="llama-3-8b", typical_tokens_per_s=50.0)
    user = UserFactory()
    _, key = create_api_key(user=user)
    return {"model": model, "user": user, "key": key, "store_kind": store_kind}


def make_router(store_kind: str) -> Router:
    return Router(store=PgStore(max_size=4) if store_kind == "pg" else OrmStore())


class ServedRouter:
    """The router app under a real uvicorn server in a thread: real sockets, real streaming."""

    def __init__(self, router: Router):
        self.router = router
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(router, host="127.0.0.1", port=self.port, lifespan="on", log_level="warning", access_log=False)
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.server.serve())

    def __enter__(self) -> "ServedRouter":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("router did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def settle(self) -> None:
        """Wait until the router wrote every release and log row (in its own loop)."""
        future = asyncio.run_coroutine_threadsafe(self.router.settle(), self.loop)
        await asyncio.wrap_future(future)


def run(scenario: Callable[[ServedRouter, httpx.AsyncClient], Any], env: dict[str, Any]) -> Any:
    """Run an async scenario against a fresh router served over TCP."""

    async def main(served: ServedRouter) -> Any:
        headers = {"Authorization": f"Bearer {env['key']}"}
        async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=30) as client:
            return await scenario(served, client)

    with ServedRouter(make_router(env["store_kind"])) as served:
        return asyncio.run(main(served))


async def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ORM code from a scenario, then give the thread's connection back to the pool."""

    def call() -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return await asyncio.to_thread(call)


def chat(max_tokens: int = 3, stream: bool = False, **extra: Any) -> dict[str, Any]:
    body = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": stream}
    body.update(extra)
    return body
