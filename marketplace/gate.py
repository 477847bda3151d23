"""A bound on the Django requests one web process runs at once (settings.DJANGO_CONCURRENCY).

Django's ASGI handler runs every request's sync code in a thread of its own,
with no limit. Each thread needs one of the process's DB_POOL_MAX pooled
connections, so a burst larger than the pool turns into threads queued on the
pool, and those still waiting after DB_POOL_TIMEOUT_S fail with a 500. Waiting
here instead costs a coroutine, not a thread, and never times out on its own:
the client's timeout is the only one. Requests are let in first come, first
served (asyncio.Semaphore wakes its waiters in order).
"""

from __future__ import annotations

import asyncio
from typing import Any

ASGIApp = Any


class ConcurrencyGate:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        # Made on first use, inside the server's event loop.
        self._slots: asyncio.Semaphore | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.limit <= 0 or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        async with self._slots:
            await self.app(scope, receive, send)
