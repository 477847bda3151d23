"""The reliability suite (issue #8): faults injected, invariants asserted, trials counted.

Each test calls the `fault_report` fixture with one line ("fault: ...: N trials,
..."). The line is printed (seen with -s) and carried on the test's report as a
user property, so it reaches the xdist controller too; the hooks that list every
line under "fault figures" at the end live in tests/conftest.py, because the
controller of `pytest tests -n 2` never loads this conftest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture
def fault_report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Print a figure line and attach it to the test's report (tests/conftest.py lists them at the end)."""

    def report(line: str) -> None:
        print(f"\n{line}")
        request.node.user_properties.append(("fault", line))

    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FAULTS_E2E_NOT_RUN:
        terminalreporter.write_sep("!", "END-TO-END fault tests NOT RUN (TEST_REDIS_URL unset)", red=True, bold=True)
        for nodeid in FAULTS_E2E_NOT_RUN:
            terminalreporter.write_line(f"  not run: {nodeid}", red=True)


# --- end-to-end faults: the same loud skip as tests/e2e (that conftest is not loaded when only
# tests/faults is collected), and a stack of their own per test ---------------------------------

FAULTS_E2E_NOT_RUN: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import os

    if os.environ.get("TEST_REDIS_URL"):
        return
    ours = [item for item in items if "e2e" in item.keywords and "tests/faults/" in item.nodeid]
    if ours and os.environ.get("CI"):
        raise pytest.UsageError("CI must run the end-to-end fault tests: set TEST_REDIS_URL (scripts/test-env.sh does).")
    for item in ours:
        item.add_marker(pytest.mark.skip(reason="end-to-end fault tests need Redis: TEST_REDIS_URL is unset"))
        FAULTS_E2E_NOT_RUN.append(item.nodeid)


def faults_database_url() -> str:
    import os
    import secrets

    from simulator.stack import with_database_name

    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith(("postgres://", "postgresql://")):
        pytest.skip("end-to-end fault tests need PostgreSQL: DATABASE_URL is not a PostgreSQL URL")
    return with_database_name(base, f"marketplace_faults_{secrets.token_hex(4)}")


def faults_broker_url() -> str:
    """TEST_REDIS_URL with a Redis database of this xdist worker's own, apart from tests/e2e's."""
    import os

    url = os.environ["TEST_REDIS_URL"]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    offset = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    head, _, db = url.rpartition("/")
    base_db = int(db) if db.isdigit() else 0
    return f"{head}/{(base_db - 8 - offset) % 16}"


@pytest.fixture
def faults_stack_urls() -> tuple[str, str]:
    return faults_database_url(), faults_broker_url()


# --- helpers the end-to-end fault tests share (imported by name, as tests/e2e does) ---------------


def sql(stack: Any, query: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Rows of a query on the stack's database (psycopg, autocommit)."""
    from psycopg.rows import dict_row

    with stack.db() as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else []


def held_router(stack: Any) -> str:
    """A router instance whose beat is a day ahead: the guard never releases its slots."""
    import secrets

    router = f"faults-router-{secrets.token_hex(4)}"
    sql(stack, "INSERT INTO nodes_routerinstance (id, started_at, last_beat_at) VALUES (%s, now(), now() + interval '1 day')", (router,))
    return router


def spot_node_with_worker(stack: Any, api: Any, model: str, name: str, *, hold_for: str | None = None) -> tuple[int, str]:
    """A spot node made through the owner's API with a ready worker registered by its agent;
    with `hold_for` (a router instance) the worker holds one slot, so a drain waits for its deadline."""
    import uuid

    created = api.post(
        "/api/v1/nodes",
        json={"name": name, "is_spot": True, "price_per_hour": "1.00", "gpu_model": "A100", "vram_gb": 80},
    )
    assert created.status_code == 201, created.text
    node = created.json()
    with stack.api(node["agent_token"], scheme="Bearer") as agent:
        registered = agent.post("/api/v1/agent/workers", json={"model": model, "endpoint": "http://127.0.0.1:9", "max_slots": 4})
    assert registered.status_code in (200, 201), registered.text
    worker_id = registered.json()["id"]
    if hold_for is not None:
        with stack.db() as conn, conn.transaction():
            conn.execute(
                "INSERT INTO nodes_slot (id, worker_id, router_instance, request_id, acquired_at) VALUES (%s, %s, %s, %s, now())",
                (uuid.uuid4(), worker_id, hold_for, f"req-{name}"),
            )
            assert conn.execute(
                "UPDATE nodes_worker SET in_flight = in_flight + 1 WHERE id = %s AND status = 'ready'", (worker_id,)
            ).rowcount == 1
    return node["id"], worker_id
