"""The router's database access: one round trip per step on PostgreSQL, the ORM elsewhere.

`PgStore` runs the SQL of `nodes.slots` on an async psycopg pool (the hot path
of a production router). `OrmStore` calls the ORM services through
`sync_to_async`, so the embedded SQLite default works the same way, slower.
"""

import asyncio
import logging
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connection

from marketplace import pg
from marketplace.enqueue import enqueue
from nodes import slots
from nodes.slots import Admission

log = logging.getLogger(__name__)


def _enqueue_finish(worker_id: str) -> None:
    from nodes.tasks import finish_drain_task

    enqueue(lambda: finish_drain_task.delay(worker_id), "finish_drain")


class Store(Protocol):
    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def admit(self, *, model_id: int, router: str, request_id: str, exclude: list[str], prefer_on_demand: bool) -> Admission | None: ...
    async def release_many(self, admissions: list[Admission]) -> None: ...
    async def beat(self, router: str) -> None: ...
    async def router_slots(self, router: str) -> set[str]: ...
    async def slot_exists(self, slot_id: str) -> bool: ...
    async def api_key_id(self, key_hash: str) -> int | None: ...
    async def models(self) -> list[dict[str, Any]]: ...
    async def write_logs(self, rows: list[dict[str, Any]]) -> None: ...


LOG_COLUMNS = (
    "request_id", "api_key_id", "model", "worker_id", "node_id", "is_spot", "stream", "outcome", "error_code",
    "status_code", "attempts", "max_tokens_cap", "admitted_at", "created_at", "ttft_ms", "duration_ms",
    "tokens_in", "tokens_out",
)


LOG_DEFAULTS = {"error_code": "", "attempts": 0, "stream": False, "duration_ms": 0, "status_code": 0}


class PgStore:
    def __init__(self, *, min_size: int = 2, max_size: int = 16):
        self.min_size = min_size
        self.max_size = max_size
        self.pool: Any = None
        self.release_conn: Any = None

    async def start(self) -> None:
        self.pool = await pg.open_pool(min_size=self.min_size, max_size=self.max_size)

    async def close(self) -> None:
        if self.release_conn is not None:
            await self.release_conn.close()
        if self.pool is not None:
            await self.pool.close()

    async def _one(self, sql: str, params: dict[str, Any]) -> tuple | None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql, params, prepare=True)
            return await cur.fetchone()

    async def admit(self, *, model_id: int, router: str, request_id: str, exclude: list[str], prefer_on_demand: bool) -> Admission | None:
        params = {"model_id": model_id, "router": router, "request_id": request_id, "exclude": exclude, "prefer_on_demand": prefer_on_demand}
        # The statement picks one candidate from its snapshot; when a drain commits
        # while it waits for that worker's lock, the re-check drops it and nothing
        # comes back although another worker may be free. A fresh statement sees
        # the drain and picks another, so only repeated misses mean "no capacity".
        for _ in range(3):
            row = await self._one(slots.PG_ADMIT_SQL, params)
            if row:
                return Admission(*row)
        return None

    async def release_many(self, admissions: list[Admission]) -> None:
        # The release loop has a connection of its own, so admissions crowding
        # the pool never hold releases back (held slots would look like load).
        from psycopg import AsyncConnection

        if self.release_conn is None or self.release_conn.closed:
            # unnest() makes the planner re-plan the batch statement every time;
            # the generic plan (primary-key index scans) is right for any batch size.
            kwargs = dict(pg.FAST_CONN_KWARGS, options=pg.FAST_CONN_KWARGS["options"] + " -c plan_cache_mode=force_generic_plan")
            self.release_conn = await AsyncConnection.connect(pg.conninfo(), **kwargs)
        try:
            cur = await self.release_conn.execute(
                slots.PG_RELEASE_MANY_SQL,
                {"slot_ids": [a.slot_id for a in admissions], "worker_ids": [a.worker_id for a in admissions]},
                prepare=True,
            )
            rows = await cur.fetchall()
        except Exception:
            await self.release_conn.close()
            raise
        for worker_id, status, in_flight in rows:
            if status == "draining" and in_flight == 0:
                # The last request of a draining worker: finish the drain now, not at the tick.
                await asyncio.to_thread(_enqueue_finish, worker_id)

    async def beat(self, router: str) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(slots.PG_ROUTER_BEAT_SQL, {"router": router})

    async def router_slots(self, router: str) -> set[str]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(slots.PG_ROUTER_SLOTS_SQL, {"router": router})
            return {r[0] for r in await cur.fetchall()}

    async def slot_exists(self, slot_id: str) -> bool:
        return await self._one("SELECT 1 FROM nodes_slot WHERE id = %(id)s", {"id": slot_id}) is not None

    async def api_key_id(self, key_hash: str) -> int | None:
        row = await self._one(
            "SELECT id FROM inference_apikey WHERE key_hash = %(h)s AND revoked_at IS NULL", {"h": key_hash}
        )
        return row[0] if row else None

    async def models(self) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT id, name, typical_tokens_per_s FROM nodes_servedmodel ORDER BY name")
            return [{"id": r[0], "name": r[1], "tokens_per_s": r[2]} for r in await cur.fetchall()]

    async def write_logs(self, rows: list[dict[str, Any]]) -> None:
        sql = f"COPY inference_requestlog ({', '.join(LOG_COLUMNS)}) FROM STDIN"
        async with self.pool.connection() as conn:
            async with conn.cursor() as cur:
                async with cur.copy(sql) as copy:
                    for row in rows:
                        await copy.write_row([row.get(c, LOG_DEFAULTS.get(c)) for c in LOG_COLUMNS])


def _orm(fn: Any) -> Any:
    """Run an ORM call in a worker thread and hand its connection back afterwards
    (to the pool on PostgreSQL: a thread that kept it would starve the pool)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(call, thread_sensitive=False)


class OrmStore:
    """Same steps through the ORM services, for SQLite and for tests of the rule."""

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def admit(self, *, model_id: int, router: str, request_id: str, exclude: list[str], prefer_on_demand: bool) -> Admission | None:
        return await _orm(slots.admit)(
            model_id=model_id, router_instance=router, request_id=request_id, exclude=exclude, prefer_on_demand=prefer_on_demand
        )

    async def release_many(self, admissions: list[Admission]) -> None:
        for admission in admissions:
            await _orm(slots.release_slot)(
                slot_id=admission.slot_id, worker_id=admission.worker_id
            )

    async def beat(self, router: str) -> None:
        await _orm(slots.router_heartbeat)(instance_id=router)

    async def router_slots(self, router: str) -> set[str]:
        from nodes.models import Slot

        ids = await _orm(lambda: list(Slot.objects.filter(router_instance=router).values_list("pk", flat=True)))()
        return {str(i) for i in ids}

    async def slot_exists(self, slot_id: str) -> bool:
        from nodes.models import Slot

        return await _orm(lambda: Slot.objects.filter(pk=slot_id).exists())()

    async def api_key_id(self, key_hash: str) -> int | None:
        from inference.models import ApiKey

        return await _orm(
            lambda: ApiKey.objects.filter(key_hash=key_hash, revoked_at__isnull=True).values_list("pk", flat=True).first()
        )()

    async def models(self) -> list[dict[str, Any]]:
        from nodes.models import ServedModel

        rows = await _orm(lambda: list(ServedModel.objects.order_by("name").values_list("pk", "name", "typical_tokens_per_s")))()
        return [{"id": pk, "name": name, "tokens_per_s": tps} for pk, name, tps in rows]

    async def write_logs(self, rows: list[dict[str, Any]]) -> None:
        from inference.models import RequestLog

        await _orm(RequestLog.objects.bulk_create)([RequestLog(**row) for row in rows])


def make_store() -> Store:
    from django.conf import settings

    choice = settings.ROUTER_STORE
    if choice == "auto":
        choice = "pg" if connection.vendor == "postgresql" else "orm"
    return PgStore(max_size=settings.ROUTER_DB_POOL) if choice == "pg" else OrmStore()
