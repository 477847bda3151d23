"""Many simulated nodes in one process: the agent protocol without the model servers.

`python -m simulator.swarm --server URL --nodes FILE --endpoints URL[,URL...] --stats FILE`

Each node of FILE (a JSON list of `{"token": ...}`) says hello, then
heartbeats at the interval the platform asks for, executes its commands once
(re-acking a redelivered id) and reports its workers, exactly as
`simulator.agent` does. What it does not do is run a model server per worker:
a worker it is told to start is registered at one of the shared `--endpoints`
(real `simulator.model_server` processes), so thousands of nodes cost one
process. A stopped worker is simply forgotten; the platform's router cut any
stream that outlived the drain.

It exists for the soak (`make soak`), where 2,000 nodes must heartbeat on a
2-core machine: one aiohttp session, keep-alive connections, no threads.
SIGTERM or SIGINT stops it; it then writes its figures to `--stats`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from simulator.agent import reply_interval

GONE_STATUSES = frozenset({"stopped", "lost"})
MAX_SLOTS = 8
LATE_GAP_S = 15.0


@dataclass
class Figures:
    heartbeats: int = 0
    heartbeat_failures: Counter[str] = field(default_factory=Counter)
    heartbeat_ms: list[float] = field(default_factory=list)
    hellos: int = 0
    commands: Counter[str] = field(default_factory=Counter)
    redelivered: int = 0
    registrations: Counter[str] = field(default_factory=Counter)
    ack_failures: int = 0
    # The longest time between two successful heartbeats of one node: a node
    # this late would be declared lost, so the soak compares it to the expiry.
    max_gap_s: float = 0.0
    late_nodes: dict[int | None, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        latencies = sorted(self.heartbeat_ms)

        def pct(q: float) -> float | None:
            return latencies[min(len(latencies) - 1, int(q / 100 * len(latencies)))] if latencies else None

        return {
            "heartbeats": self.heartbeats,
            "heartbeat_failures": dict(self.heartbeat_failures),
            "heartbeat_p50_ms": pct(50),
            "heartbeat_p99_ms": pct(99),
            "heartbeat_max_ms": latencies[-1] if latencies else None,
            "hellos": self.hellos,
            "commands": dict(self.commands),
            "redelivered": self.redelivered,
            "registrations": dict(self.registrations),
            "ack_failures": self.ack_failures,
            "max_gap_s": round(self.max_gap_s, 2),
            "late_nodes": {str(k): v for k, v in self.late_nodes.items()},
        }


class SimNode:
    """One node's agent state: its workers and the commands it has executed."""

    def __init__(self, swarm: Swarm, token: str, index: int) -> None:
        self.swarm = swarm
        self.headers = {"Authorization": f"Bearer {token}"}
        self.endpoint = swarm.endpoints[index % len(swarm.endpoints)]
        self.workers: dict[str, str] = {}  # worker id -> status reported
        self.done: dict[str, dict[str, Any]] = {}  # command id -> ack body
        self.running: set[str] = set()  # command ids being executed
        self.acking: set[str] = set()  # command ids whose ack is on the way
        self.tasks: set[asyncio.Task[None]] = set()
        self.interval = 5.0
        self.last_ok: float | None = None
        self.node_id: int | None = None
        self.max_gap_s = 0.0

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.swarm.session.post(f"{self.swarm.server}/api/v1/agent/{path}", json=body, headers=self.headers) as r:
            payload = await r.json(content_type=None) if r.status < 500 else None
            return r.status, payload

    async def run(self, stop: asyncio.Event) -> None:
        # Nodes boot at different times: spread the hellos over the ramp.
        if await _wait(stop, random.uniform(0, self.swarm.ramp_s)):
            return
        while not stop.is_set():
            try:
                status, reply = await self.post("hello", {
                    "hardware": {"gpu_model": "A100", "gpu_count": 1, "vram_gb": 80},
                    "cloud": {"provider": None, "instance_id": None, "instance_type": None, "region": None, "zone": None},
                })
            except (aiohttp.ClientError, asyncio.TimeoutError):
                status, reply = 0, None
            if status == 200:
                self.swarm.figures.hellos += 1
                self.node_id = reply.get("node_id")
                self.last_ok = time.monotonic()
                self._interval(reply)
                self.handle_soon(reply.get("commands") or [])
                break
            if await _wait(stop, 1.0):
                return
        while not await _wait(stop, self.interval * random.uniform(0.9, 1.1)):
            await self.heartbeat()

    async def heartbeat(self) -> None:
        figures = self.swarm.figures
        report = [{"id": wid, "status": status, "in_flight": 0} for wid, status in self.workers.items()]
        started = time.monotonic()
        try:
            status, reply = await self.post("heartbeat", {"workers": report, "rentals": []})
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            figures.heartbeat_failures[type(exc).__name__] += 1
            return
        if status != 200 or not isinstance(reply, dict):
            figures.heartbeat_failures[str(status)] += 1
            return
        now = time.monotonic()
        figures.heartbeats += 1
        figures.heartbeat_ms.append((now - started) * 1000)
        if self.last_ok is not None:
            self.max_gap_s = max(self.max_gap_s, now - self.last_ok)
            figures.max_gap_s = max(figures.max_gap_s, self.max_gap_s)
        self.last_ok = now
        self._interval(reply)
        commands = reply.get("commands") or []
        stopping = {str((c.get("payload") or {}).get("worker_id")) for c in commands if c.get("kind") == "stop_worker"}
        for entry in reply.get("workers") or []:
            wid = str(entry.get("id"))
            if entry.get("status") in GONE_STATUSES and wid not in stopping:
                self.workers.pop(wid, None)
        self.handle_soon(commands)

    def handle_soon(self, commands: list[dict[str, Any]]) -> None:
        """Commands run beside the heartbeats, as the reference agent's threads do: a slow
        registration must never hold back the heartbeat that keeps the worker alive."""
        if commands:
            task = asyncio.create_task(self.handle(commands))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def handle(self, commands: list[dict[str, Any]]) -> None:
        for command in commands:
            cid, kind = str(command.get("id")), str(command.get("kind"))
            if cid in self.running:
                continue  # redelivered while it is still being executed
            if cid in self.done:
                self.swarm.figures.redelivered += 1
                await self.ack(cid, self.done[cid])
                continue
            self.running.add(cid)
            self.swarm.figures.commands[kind] += 1
            payload = command.get("payload") or {}
            if kind == "start_worker":
                result = await self.start_worker(payload)
            elif kind == "stop_worker":
                self.workers.pop(str(payload.get("worker_id")), None)
                result = {"ok": True, "detail": "stopped", "interrupted": 0}
            elif kind in ("start_rental", "stop_rental", "run_render"):
                result = {"ok": True}
            else:
                result = {"ok": False, "detail": "unknown command kind"}
            self.done[cid] = result
            self.running.discard(cid)
            await self.ack(cid, result)

    async def start_worker(self, payload: dict[str, Any]) -> dict[str, Any]:
        wid = str(payload["worker_id"])
        # Reported `starting` from now on, as the reference agent does while its
        # model server boots: the heartbeats keep the worker from expiring.
        self.workers[wid] = "starting"
        body = {"model": payload["model"], "endpoint": self.endpoint, "max_slots": MAX_SLOTS, "worker_id": wid}
        try:
            status, reply = await self.post("workers", body)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.swarm.figures.registrations[type(exc).__name__] += 1
            self.workers.pop(wid, None)
            return {"ok": False, "detail": f"registration failed: {exc}"}
        self.swarm.figures.registrations[str(status)] += 1
        if status >= 400 or not isinstance(reply, dict):
            self.workers.pop(wid, None)
            return {"ok": False, "detail": f"registration answered {status}"}
        if wid in self.workers:  # not stopped while registering
            # A `draining` worker is kept: the platform drains it and sends stop_worker.
            self.workers[wid] = "ready"
        return {"ok": True}

    async def ack(self, cid: str, result: dict[str, Any]) -> None:
        # A command redelivered while its ack is still on the way is not acked twice:
        # under load that would multiply the acks the platform has to queue.
        if cid in self.acking:
            return
        self.acking.add(cid)
        try:
            await self._ack(cid, result)
        finally:
            self.acking.discard(cid)

    async def _ack(self, cid: str, result: dict[str, Any]) -> None:
        try:
            status, _ = await self.post(f"commands/{cid}/ack", result)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            status = 0
        if status >= 500 or status in (0, 429):
            # Not remembered as acked: the platform redelivers it in a later reply.
            self.swarm.figures.ack_failures += 1

    def _interval(self, reply: dict[str, Any]) -> None:
        interval = reply_interval(reply)
        if interval is not None:
            self.interval = interval


class Swarm:
    def __init__(
        self, server: str, tokens: list[str], endpoints: list[str], *, connections: int, ramp_s: float,
        boot_stats: Path | None = None,
    ) -> None:
        self.boot_stats = boot_stats
        self.server = server.rstrip("/")
        self.endpoints = endpoints
        self.tokens = tokens
        self.connections = connections
        self.ramp_s = ramp_s
        self.figures = Figures()
        self.nodes = [SimNode(self, token, i) for i, token in enumerate(tokens)]
        self.session: aiohttp.ClientSession

    def reset_figures(self) -> None:
        if self.boot_stats is not None:
            self._note_late_nodes()
            self.boot_stats.write_text(json.dumps(self.figures.as_dict(), indent=1))
        self.figures = Figures()
        now = time.monotonic()
        for node in self.nodes:
            node.max_gap_s = 0.0
            if node.last_ok is not None:
                node.last_ok = now

    async def run(self, stop: asyncio.Event) -> None:
        # Real agents each hold their own connection: no shared pool to queue behind
        # (0 = unlimited). Idle connections are dropped before uvicorn's 5 s
        # keep-alive closes them under a request.
        connector = aiohttp.TCPConnector(limit=self.connections, keepalive_timeout=3)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as self.session:
            await asyncio.gather(*(node.run(stop) for node in self.nodes))
        self._note_late_nodes()

    def _note_late_nodes(self) -> None:
        # Nodes whose heartbeats were ever more than LATE_GAP_S apart: the soak
        # tells a worker lost for a reason from a false one with this.
        self.figures.late_nodes = {n.node_id: round(n.max_gap_s, 1) for n in self.nodes if n.max_gap_s > LATE_GAP_S}


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleeps, or returns True at once when told to stop."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--nodes", required=True, help="JSON list of {token}")
    parser.add_argument("--endpoints", required=True, help="comma-separated model server URLs")
    parser.add_argument("--stats", required=True, help="where to write the figures on exit (JSON)")
    parser.add_argument("--connections", type=int, default=0, help="most connections at once (0: one per request in flight)")
    parser.add_argument("--ramp-s", type=float, default=240.0, help="the hellos are spread over this many seconds")
    args = parser.parse_args(argv)
    tokens = [n["token"] for n in json.loads(Path(args.nodes).read_text())]
    swarm = Swarm(args.server, tokens, args.endpoints.split(","), connections=args.connections, ramp_s=args.ramp_s,
                  boot_stats=Path(f"{args.stats}.boot"))

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # SIGUSR1: start the figures afresh (the soak sends it once the fleet is up,
    # so the boot storm does not count against the steady state).
    loop.add_signal_handler(signal.SIGUSR1, swarm.reset_figures)
    try:
        loop.run_until_complete(swarm.run(stop))
    finally:
        loop.close()
        Path(args.stats).write_text(json.dumps(swarm.figures.as_dict(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
