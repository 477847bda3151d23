"""End-to-end fixtures: the real processes (web, Celery worker and beat, agents) on PostgreSQL + Redis.

The test process never touches the stack's database through Django: pytest-django
binds this process's Django to its own *test* database, while the stack's
processes run on a dedicated database (`marketplace_e2e_<random>`) that the
stack creates, migrates in a child and drops at the end. Tests act as clients
do, over HTTP (API.md), and read the database with plain psycopg only where
the API has nothing to say (a worker's endpoint, a command's ack).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from psycopg.rows import dict_row

from simulator.stack import Proc, Stack, pid_alive, port_open, wait_until, with_database_name

E2E_NOT_RUN: list[str] = []

# Short clocks so a whole reclaim fits in seconds; each is a setting the
# production defaults scale up (ARCHITECTURE.md, "Timing defaults").
E2E_ENV = {
    "HEARTBEAT_INTERVAL_S": 1,
    "DRAIN_CEILING_S": 8,
    "STOP_GRACE_S": 2,
    "DRAIN_TICK_S": 1,
    "LOG_LEVEL": "INFO",
}
OWNER = {"username": "owner", "password": "owner-pass-123"}  # made by `manage.py seed_demo`


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("TEST_REDIS_URL"):
        return
    e2e = [item for item in items if "e2e" in item.keywords]
    if e2e and os.environ.get("CI"):
        raise pytest.UsageError("CI must run the end-to-end tests: set TEST_REDIS_URL (scripts/test-env.sh does).")
    skip = pytest.mark.skip(reason="end-to-end tests need Redis: TEST_REDIS_URL is unset (see scripts/test-env.sh)")
    for item in e2e:
        item.add_marker(skip)
        E2E_NOT_RUN.append(item.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if E2E_NOT_RUN:
        terminalreporter.write_sep("!", "END-TO-END tests NOT RUN (TEST_REDIS_URL unset)", red=True, bold=True)
        for nodeid in E2E_NOT_RUN:
            terminalreporter.write_line(f"  not run: {nodeid}", red=True)


def e2e_database_url() -> str:
    """The test run's PostgreSQL server, a database of the stack's own."""
    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith(("postgres://", "postgresql://")):
        pytest.skip("end-to-end tests need PostgreSQL: DATABASE_URL is not a PostgreSQL URL")
    return with_database_name(base, f"marketplace_e2e_{secrets.token_hex(4)}")


def e2e_broker_url() -> str:
    """TEST_REDIS_URL, one Redis database per xdist worker.

    Two stacks on one Redis database would consume each other's tasks (a
    finish_drain for a worker the other database has never seen is simply
    lost) and each other's beat ticks, so parallel runs must not share one.
    """
    url = os.environ["TEST_REDIS_URL"]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    offset = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    if not offset:
        return url
    head, _, db = url.rpartition("/")
    base_db = int(db) if db.isdigit() else 0
    return f"{head}/{(base_db - offset) % 16}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack per test module: its start-up (migrations, four processes) is most of an e2e test's cost."""
    log_dir = tmp_path_factory.mktemp("e2e-logs")
    with Stack(
        e2e_database_url(), e2e_broker_url(), E2E_ENV, log_dir=log_dir, fresh_database=True, drop_database_on_stop=True
    ) as running:
        running.manage("seed_demo")
        yield running


@pytest.fixture(scope="module")
def owner_api(stack: Stack) -> Iterator[httpx.Client]:
    response = stack.api().post("/api/v1/auth/token", json=OWNER)
    assert response.status_code == 200, response.text
    with stack.api(response.json()["token"]) as client:
        yield client


# --- helpers: tests reach them through the `e2e` fixture (importing a conftest by name is fragile) ---


class E2E:
    """What the e2e tests do over and over against a running stack."""

    env = E2E_ENV

    def __init__(self, stack: Stack, api: httpx.Client) -> None:
        self.stack = stack
        self.api = api

    @staticmethod
    def parse_time(value: str) -> datetime:
        parsed = datetime.fromisoformat(value)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)

    @staticmethod
    def now() -> datetime:
        return datetime.now(UTC)

    @staticmethod
    def server_gone(endpoint: str, pid: int) -> bool:
        """The model server's process has exited and nothing listens on its port any more."""
        host, port = endpoint.rsplit("//", 1)[1].rsplit(":", 1)
        return not pid_alive(pid) and not port_open(host, int(port))

    def wait(self, predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
        return wait_until(predicate, timeout, what, interval=interval, on_timeout=self.stack.diagnostics)

    def spot_node_with_agent(self, name: str) -> tuple[dict[str, Any], Proc]:
        """A spot node created through the API, with the reference agent running for it."""
        response = self.api.post(
            "/api/v1/nodes",
            json={"name": name, "is_spot": True, "price_per_hour": "1.20", "gpu_model": "A100", "vram_gb": 80},
        )
        assert response.status_code == 201, response.text
        node = response.json()
        agent = self.stack.start_agent(
            node["agent_token"],
            gpu_model="A100",
            vram_gb=80,
            stop_grace_s=E2E_ENV["STOP_GRACE_S"],
            # The agent's CLI sends null for every cloud flag left out, and the
            # platform's hello rejects null with a 400: give them all.
            cloud="aws",
            instance_id=f"i-{secrets.token_hex(6)}",
            instance_type="p4d.24xlarge",
            region="us-east-1",
            zone="us-east-1a",
        )
        return node, agent

    def node(self, node_id: int) -> dict[str, Any]:
        response = self.api.get(f"/api/v1/nodes/{node_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def reclaims(self, node_id: int) -> list[dict[str, Any]]:
        response = self.api.get(f"/api/v1/nodes/{node_id}/reclaims")
        assert response.status_code == 200, response.text
        return response.json()

    def ready_worker(self, node_id: int, *, not_ids: tuple[str, ...] = (), timeout: float = 20) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            workers = self.node(node_id)["workers"]
            return next((w for w in workers if w["status"] == "ready" and w["id"] not in not_ids), None)

        return self.wait(ready, timeout, f"a ready worker on node {node_id}", interval=0.1)

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Rows of a query on the stack's database (psycopg, autocommit)."""
        with self.stack.db() as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []

    def worker_row(self, worker_id: str) -> dict[str, Any]:
        rows = self.sql("SELECT * FROM nodes_worker WHERE id = %s", (worker_id,))
        assert rows, f"no worker {worker_id}"
        return rows[0]

    def model_server(self, worker_id: str) -> tuple[str, int]:
        """The endpoint and pid of a worker's model server (the API does not publish endpoints)."""
        endpoint = self.worker_row(worker_id)["endpoint"]
        stats = httpx.get(f"{endpoint}/sim/stats", timeout=2, trust_env=False)
        assert stats.status_code == 200, stats.text
        return endpoint, int(stats.json()["pid"])

    def serves(self, endpoint: str, model: str) -> bool:
        """The model server answers the OpenAI models list with its model."""
        response = httpx.get(f"{endpoint}/v1/models", timeout=2, trust_env=False)
        return response.status_code == 200 and [m["id"] for m in response.json()["data"]] == [model]

    def pause(self, node_id: int) -> dict[str, Any]:
        response = self.api.post(f"/api/v1/nodes/{node_id}/pause")
        assert response.status_code == 202, response.text
        return response.json()


@pytest.fixture
def e2e(stack: Stack, owner_api: httpx.Client) -> E2E:
    return E2E(stack, owner_api)
