"""marketplace.gate: Django requests beyond the pool wait in the event loop, in order, and none is dropped."""

from __future__ import annotations

import asyncio
from typing import Any

from marketplace.gate import ConcurrencyGate


class SlowApp:
    """An ASGI app that records how many calls run at once and in which order they started."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0
        self.started: list[int] = []
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.started.append(scope.get("n", -1))
        await self.release.wait()
        self.running -= 1


async def _burst(gate: ConcurrencyGate, app: SlowApp, n: int, scope_type: str = "http") -> None:
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(gate({"type": scope_type, "n": i}, None, None)))
        await asyncio.sleep(0)  # arrival order = i
    await asyncio.sleep(0.01)
    seen_while_blocked = app.running
    app.release.set()
    await asyncio.gather(*tasks)
    app.blocked_running = seen_while_blocked  # type: ignore[attr-defined]


def test_gate_runs_at_most_limit_requests_and_lets_the_rest_in_arrival_order() -> None:
    app = SlowApp()
    gate = ConcurrencyGate(app, limit=3)
    asyncio.run(_burst(gate, app, 20))
    assert app.blocked_running == 3
    assert app.peak == 3
    assert app.started == list(range(20))  # every request ran, first come first served


def test_gate_off_and_lifespan_pass_straight_through() -> None:
    app = SlowApp()
    asyncio.run(_burst(ConcurrencyGate(app, limit=0), app, 10))
    assert app.blocked_running == 10
    lifespan = SlowApp()
    asyncio.run(_burst(ConcurrencyGate(lifespan, limit=1), lifespan, 4, scope_type="lifespan"))
    assert lifespan.blocked_running == 4
