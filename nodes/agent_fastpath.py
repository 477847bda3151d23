"""Agent heartbeats on PostgreSQL without Django's request cycle.

Ten thousand nodes beating every ten seconds is a thousand heartbeats a second,
more than Django's request cycle gives on two cores. This ASGI handler runs
`PG_HEARTBEAT_SQL` (one round trip) for well-formed heartbeats of known agents
and hands every other request, body included, to Django: the DRF view stays the
reference for validation, authentication and error shapes.
"""

import asyncio
import json
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from marketplace import pg
from nodes.heartbeats import PG_HEARTBEAT_SQL, count_heartbeat, heartbeat_params, heartbeat_reply
from nodes.tokens import hash_token

log = logging.getLogger(__name__)

PATH = "/api/v1/agent/heartbeat"
MAX_BODY_BYTES = 256 * 1024
TOKEN_CACHE_S = 30.0


def _valid_heartbeat(body: Any) -> list[dict[str, Any]] | None:
    """The workers of a heartbeat exactly as the DRF serializer accepts it; None otherwise."""
    if not isinstance(body, dict) or set(body) - {"workers", "rentals"}:
        return None
    workers, rentals = body.get("workers", []), body.get("rentals", [])
    if not isinstance(workers, list) or not isinstance(rentals, list):
        return None
    for w in workers:
        if not isinstance(w, dict) or not isinstance(w.get("id"), str) or not isinstance(w.get("status"), str):
            return None
        if len(w["status"]) > 16 or "\x00" in w["status"]:
            return None
        in_flight = w.get("in_flight", 0)
        if type(in_flight) is not int or in_flight < 0:
            return None
        try:
            uuid.UUID(w["id"])
        except ValueError:
            return None
    for r in rentals:
        if not isinstance(r, dict) or type(r.get("id")) is not int or not isinstance(r.get("status"), str):
            return None
    return workers


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class AgentFastPath:
    def __init__(self, fallback: Any):
        self.fallback = fallback
        self.pool: Any = None
        self._lock = asyncio.Lock()
        self._tokens: dict[str, tuple[int | None, float]] = {}

    def handles(self, scope: dict[str, Any]) -> bool:
        return scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == PATH

    async def _pool(self) -> Any:
        if self.pool is None:
            async with self._lock:
                if self.pool is None:
                    self.pool = await pg.open_pool(min_size=1, max_size=settings.AGENT_FASTPATH_POOL)
        return self.pool

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
            self.pool = None

    async def _node_id(self, conn: Any, token_hash: str) -> int | None:
        hit = self._tokens.get(token_hash)
        if hit is not None and hit[1] > time.monotonic():
            return hit[0]
        cur = await conn.execute("SELECT id FROM nodes_node WHERE agent_token_hash = %s", (token_hash,))
        row = await cur.fetchone()
        node_id = row[0] if row else None
        if len(self._tokens) > 200_000:
            self._tokens.clear()
        self._tokens[token_hash] = (node_id, time.monotonic() + TOKEN_CACHE_S)
        return node_id

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body, complete = await _read(receive)
        reply = None
        if complete:
            try:
                reply = await self._try(scope, body)
            except Exception:
                log.exception("agent_fastpath_failed; answering through Django")
                reply = None
        if reply is None:
            await self.fallback(scope, _replay(body, receive, complete), send)
            return
        data = json.dumps(reply).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
            (b"vary", b"Accept"), (b"allow", b"POST, OPTIONS"),
        ]})
        await send({"type": "http.response.body", "body": data})

    async def _try(self, scope: dict[str, Any], body: bytes) -> dict[str, Any] | None:
        auth = next((v for k, v in scope["headers"] if k == b"authorization"), b"").split()
        if len(auth) != 2 or auth[0].lower() != b"bearer":
            return None
        content_type = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
        if not content_type.startswith(b"application/json"):
            return None
        try:
            workers = _valid_heartbeat(json.loads(body))
        except ValueError:
            return None
        if workers is None:
            return None
        pool = await self._pool()
        async with pool.connection() as conn:
            node_id = await self._node_id(conn, hash_token(auth[1].decode("latin-1")))
            if node_id is None:
                return None
            cur = await conn.execute(PG_HEARTBEAT_SQL, heartbeat_params(node_id=node_id, workers=workers), prepare=True)
            rows = await cur.fetchall()
        reply = heartbeat_reply(rows, workers)
        if reply is not None:
            previous = next(row[3] for row in rows if row[0] == "node")
            count_heartbeat(previous, datetime.now(UTC))
            for w in reply["workers"]:
                w["expires_at"] = _iso(w["expires_at"])
        return reply


async def _read(receive: Any) -> tuple[bytes, bool]:
    """The body, and whether it was read whole within the size the fast path takes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if not message.get("more_body"):
            return b"".join(chunks), True
        if size > MAX_BODY_BYTES:
            return b"".join(chunks), False


def _replay(body: bytes, receive: Any, complete: bool) -> Any:
    """A receive() that hands Django the body already read, then the rest of the stream."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": not complete}
        return await receive()

    return replay
