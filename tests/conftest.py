import os

import pytest
from django.db import connection
from rest_framework.test import APIClient

from marketplace.celery import app as celery_app
from tests.factories import ServedModelFactory, UserFactory

PG_ONLY_SKIPPED: list[str] = []


@pytest.fixture(autouse=True, scope="session")
def _celery_eager():
    # Unit and API tests run tasks in-process when their transaction commits;
    # the e2e tests run a real Celery worker and beat instead.
    celery_app.conf.task_always_eager = True
    yield


@pytest.fixture(autouse=True, scope="session")
def _close_db_pools(django_db_setup, django_db_blocker):
    """Hand pooled connections back before pytest-django drops the test database."""
    yield
    from django.db import connections

    default = connections["default"]
    if not str(default.settings_dict["NAME"]).startswith("test_"):
        return  # no test database was set up (e.g. only process-level tests ran): nothing of ours to close
    with django_db_blocker.unblock():
        for conn in connections.all():
            if getattr(conn, "pool", None) is not None:
                conn.close_pool()
        if default.vendor == "postgresql":
            # Threads of the router tests may still hold sessions: end them, or
            # the test database cannot be dropped.
            with default.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            default.close()


@pytest.fixture(autouse=True)
def _fresh_rate_limits():
    """Throttle counters live in the cache: each test starts with full budgets."""
    from django.core.cache import cache

    cache.clear()
    yield


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def pytest_collection_modifyitems(config, items):
    from django.conf import settings

    vendor = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    if vendor.startswith("postgres"):
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL (row locks under real concurrency); set DATABASE_URL")
    for item in items:
        if "postgres" in item.keywords:
            if os.environ.get("CI"):
                raise pytest.UsageError("CI must run on PostgreSQL: no test may be skipped. Set DATABASE_URL.")
            item.add_marker(skip)
            PG_ONLY_SKIPPED.append(item.nodeid)


# Figures of the reliability suite (tests/faults): each test attaches "fault: ..." lines to its report
# (the `fault_report` fixture); they are listed at the end, under xdist too (this runs in the controller).
FAULT_FIGURES: list[str] = []


def pytest_runtest_logreport(report):
    if report.when == "call":
        FAULT_FIGURES.extend(str(value) for key, value in getattr(report, "user_properties", ()) if key == "fault")


def pytest_terminal_summary(terminalreporter):
    if FAULT_FIGURES:
        terminalreporter.write_sep("=", "fault figures (tests/faults)")
        for line in FAULT_FIGURES:
            terminalreporter.write_line(line)
    if PG_ONLY_SKIPPED:
        terminalreporter.write_sep("!", "PostgreSQL-only tests NOT RUN (SQLite in use)", red=True, bold=True)
        for nodeid in PG_ONLY_SKIPPED:
            terminalreporter.write_line(f"  not run: {nodeid}", red=True)


@pytest.fixture
def model(db):
    return ServedModelFactory()


@pytest.fixture
def owner(db):
    return UserFactory(username="owner")


@pytest.fixture
def renter(db):
    return UserFactory(username="renter")


@pytest.fixture
def outsider(db):
    return UserFactory(username="outsider")


def client_for(user) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


@pytest.fixture
def owner_api(owner):
    return client_for(owner)


@pytest.fixture
def renter_api(renter):
    return client_for(renter)


@pytest.fixture
def outsider_api(outsider):
    return client_for(outsider)


def agent_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def is_postgres(db) -> bool:
    return connection.vendor == "postgresql"
