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

from simulator.stack import Stack, pid_alive, port_open, wait_until, with_database_name

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
