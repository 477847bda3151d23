"""Direct async PostgreSQL access for the two hot paths (router, agent heartbeats)."""

from typing import Any

from django.db import connection

# Leases, expiries and last-seen times are rewritten every few seconds: their
# commits need not wait for the WAL flush. A database crash can lose only the
# last few milliseconds of them, each change still atomic; the next heartbeat
# or release writes them again.
FAST_CONN_KWARGS: dict[str, Any] = {"autocommit": True, "options": "-c synchronous_commit=off"}


def conninfo() -> str:
    """The default database as Django sees it now (pytest-django's test database included)."""
    s = connection.settings_dict
    parts = {"dbname": s["NAME"], "user": s.get("USER"), "password": s.get("PASSWORD"), "host": s.get("HOST"), "port": s.get("PORT")}
    return " ".join(f"{k}={v}" for k, v in parts.items() if v)


async def open_pool(*, min_size: int, max_size: int) -> Any:
    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool(conninfo(), min_size=min_size, max_size=max_size, open=False, kwargs=FAST_CONN_KWARGS)
    await pool.open(wait=True, timeout=10)
    return pool
