"""The soak (`make soak`): a big fleet, steady traffic and owners flipping Pause/Available for minutes.

`python -m bench.soak [--nodes 2000] [--streams 100] [--minutes 10]`

Real processes on PostgreSQL and Redis: two uvicorn web processes (API and
router), a Celery worker and beat, MODEL_SERVERS fake model servers, and
`simulator.swarm` speaking the agent protocol for every node (hello,
heartbeats, start/stop commands, acks). This process creates the nodes, then
for the whole run:

- keeps `--streams` chat completions streaming through the router: most lanes
  short answers, LONG_LANES lanes answers of 30-150 s, so some are still
  running when their node's two minutes are up;
- pauses a random spot node about every PAUSE_EVERY_S seconds through the
  owner's REST API (half of them nodes that are serving a stream right now)
  and resumes each after 5-90 s.

At the end it hangs up on the streams still running, stops the swarm, and
prints: drains, requests (finished, cut, refused), leaked slots, false lost
workers, streams cut although they could have finished, drains past their
deadline, heartbeat figures, and the memory of every process at the start
and the end. It exits 1 when an invariant is broken (leaked slots, false lost
workers, a stream cut that could have finished, a drain past its deadline +
2 s, a stream that ended without [DONE] or a cut notice).

The fleet boots over `--ramp-s` (default: BOOT_NODES_PER_S nodes a second, about
4 minutes for 2,000), as a real fleet comes up, and heartbeat figures are
reported for the boot and for the soak itself separately.

Outside the normal suite: it takes `--minutes` plus the boot and a minute of
set-up. tests/e2e/test_soak_smoke.py runs it in miniature.
Environment: SOAK_DATABASE_URL (dropped and recreated; default database
`marketplace_bench_soak` on the local server), SOAK_REDIS_URL (default
redis://127.0.0.1:6379/12).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Before bench is imported: the soak has its own database and broker, so a
# soak never clobbers a benchmark's (or the other way round).
os.environ["BENCH_DATABASE_URL"] = os.environ.get("SOAK_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/marketplace_bench_soak")
os.environ["BENCH_REDIS_URL"] = os.environ.get("SOAK_REDIS_URL", "redis://127.0.0.1:6379/12")

import aiohttp  # noqa: E402
import psycopg  # noqa: E402

from bench import CHILD_ENV, bench_broker_url, fresh_database, log_dir, percentile, setup_django  # noqa: E402
from simulator.procs import free_port  # noqa: E402
from simulator.swarm import LATE_GAP_S  # noqa: E402
from simulator.stack import Stack, group_members, libpq_url, port_open, wait_until  # noqa: E402

MODEL = "llama-3-8b"
TOKENS_PER_S = 20.0  # the fake model servers' pace, and what the model declares (the spot cap follows it)
MODEL_SERVERS = 4
LONG_LANES = 10
PAUSE_EVERY_S = 1.0
SPOT_SHARE = 0.8
# A cut stream "could have finished" when its last token was due this long
# before the cut arrived: the margin absorbs pacing jitter on a loaded machine.
COULD_FINISH_MARGIN_S = 2.0
WORKER_EXPIRY_S = 30.0  # the platform's default (settings.WORKER_EXPIRY_S); the soak runs with defaults
LEAK_WAIT_S = 15.0
VACUUM_EVERY_S = 30.0
# Nodes booting per second: what this 2-core machine registers (hello, placement,
# registration, ack through Django) while the rest of the fleet heartbeats.
BOOT_NODES_PER_S = 8.0


# --- set-up ----------------------------------------------------------------------------


def make_fleet(count: int) -> tuple[list[dict[str, Any]], str, str]:
    """`count` nodes (SPOT_SHARE of them spot) with agent tokens; also the owner's API token and an inference key."""
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from rest_framework.authtoken.models import Token

    from inference.keys import create_api_key
    from nodes.models import ServedModel
    from nodes.services import create_node

    owner = get_user_model().objects.create_user(username="soak-owner", password="soak-owner-pass-123")
    renter = get_user_model().objects.create_user(username="soak-renter", password="soak-renter-pass-123")
    ServedModel.objects.create(
        name=MODEL, min_vram_gb=16, typical_tokens_per_s=TOKENS_PER_S, target_replicas=1_000_000, max_slots=8
    )
    nodes = []
    spot_every = round(1 / (1 - SPOT_SHARE))  # every 5th node on demand at 80 % spot
    for start in range(0, count, 250):
        with transaction.atomic():
            for i in range(start, min(start + 250, count)):
                is_spot = i % spot_every != 0
                node, token = create_node(
                    provider=owner, name=f"soak-{i}", is_spot=is_spot, gpu_model="A100", vram_gb=80,
                    cloud="aws", instance_type="g5.xlarge", region="us-east-1", zone=f"us-east-1{'abcdef'[i % 6]}",
                )
                nodes.append({"id": node.pk, "token": token, "is_spot": is_spot})
    owner_token = Token.objects.create(user=owner).key
    _, api_key = create_api_key(user=renter, name="soak")
    return nodes, owner_token, api_key


# --- memory ------------------------------------------------------------------------------


def rss_mb(pids: list[int]) -> float:
    total_kb = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total_kb / 1024


def memory(stack: Stack) -> dict[str, tuple[int, float]]:
    """Resident memory per process group of the stack (name -> (processes, MB)), and this driver's."""
    out = {name: (len(members), rss_mb(members)) for name, proc in stack.procs.items() if (members := group_members(proc.pid))}
    out["soak driver"] = (1, rss_mb([os.getpid()]))
    return out


# --- traffic -------------------------------------------------------------------------------


@dataclass
class Traffic:
    started: int = 0
    done: int = 0
    cut: int = 0
    cut_could_finish: list[str] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)  # status -> count (503 no capacity, ...)
    incomplete: list[str] = field(default_factory=list)  # ended without [DONE] and without a cut notice
    hung_up_at_end: int = 0
    capped: int = 0
    first_chunk_ms: list[float] = field(default_factory=list)


async def one_stream(session: aiohttp.ClientSession, server: str, traffic: Traffic, *, long: bool) -> None:
    max_tokens = random.randint(600, 3000) if long else random.randint(8, 64)
    body = {
        "model": MODEL, "stream": True, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Tell me about spot instances."}],
    }
    began = time.monotonic()
    traffic.started += 1
    try:
        async with session.post(f"{server}/v1/chat/completions", json=body) as response:
            if response.status != 200:
                await response.read()
                traffic.refused[str(response.status)] += 1
                await asyncio.sleep(0.5)  # no ready worker with a free slot: back off as a client would
                return
            cap = response.headers.get("x-max-tokens-cap")
            if cap is not None:
                traffic.capped += 1
            tokens = min(max_tokens, int(cap)) if cap else max_tokens
            first = True
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                if first:
                    traffic.first_chunk_ms.append((time.monotonic() - began) * 1000)
                    first = False
                if line == b"data: [DONE]":
                    traffic.done += 1
                    return
                if b"worker_reclaimed" in line:
                    traffic.cut += 1
                    due = began + tokens / TOKENS_PER_S
                    if due < time.monotonic() - COULD_FINISH_MARGIN_S:
                        traffic.cut_could_finish.append(
                            f"{tokens} tokens due {time.monotonic() - due:.1f} s before the cut: {line[:160]!r}"
                        )
                    return
                if b'"error"' in line:
                    traffic.incomplete.append(line[:200].decode(errors="replace"))
                    return
            traffic.incomplete.append(f"stream ended without [DONE] after {time.monotonic() - began:.1f} s")
    except asyncio.CancelledError:
        traffic.hung_up_at_end += 1
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        traffic.incomplete.append(f"{type(exc).__name__}: {exc}")


async def lane(session: aiohttp.ClientSession, server: str, traffic: Traffic, stop: asyncio.Event, *, long: bool) -> None:
    while not stop.is_set():
        await one_stream(session, server, traffic, long=long)
        await asyncio.sleep(random.uniform(0.0, 0.2))


# --- owners flipping Pause / Available --------------------------------------------------


@dataclass
class Chaos:
    pauses: Counter[str] = field(default_factory=Counter)  # HTTP status -> count
    pauses_serving: int = 0
    resumes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # a call that got no answer


SERVING_SPOT_NODES = """
    SELECT DISTINCT w.node_id FROM nodes_slot s JOIN nodes_worker w ON w.id = s.worker_id
    JOIN nodes_node n ON n.id = w.node_id
    WHERE w.status = 'ready' AND n.is_spot AND n.workload_enabled
"""


async def chaos(
    session: aiohttp.ClientSession, server: str, owner_token: str, spot_ids: list[int], db: psycopg.AsyncConnection[Any],
    figures: Chaos, stop: asyncio.Event,
) -> None:
    headers = {"Authorization": f"Token {owner_token}"}
    paused: set[int] = set()
    resumers: set[asyncio.Task[None]] = set()

    async def call(action: str, node_id: int) -> int:
        try:
            async with session.post(f"{server}/api/v1/nodes/{node_id}/{action}", headers=headers) as r:
                await r.read()
                return r.status
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            figures.errors[f"{action}: {type(exc).__name__}"] += 1
            return 0

    async def resume_later(node_id: int) -> None:
        await asyncio.sleep(random.uniform(5, 90))
        status = await call("resume", node_id)
        figures.resumes[str(status)] += 1
        paused.discard(node_id)

    while not stop.is_set():
        await asyncio.sleep(random.expovariate(1 / PAUSE_EVERY_S))
        serving = random.random() < 0.5
        candidates: list[int] = []
        if serving:
            async with db.cursor() as cur:
                await cur.execute(SERVING_SPOT_NODES)
                candidates = [row[0] for row in await cur.fetchall() if row[0] not in paused]
        if not candidates:
            serving = False
            candidates = [n for n in random.sample(spot_ids, min(50, len(spot_ids))) if n not in paused]
        if not candidates:
            continue
        node_id = random.choice(candidates)
        status = await call("pause", node_id)
        figures.pauses[str(status)] += 1
        if status == 202:
            figures.pauses_serving += serving
            paused.add(node_id)
            task = asyncio.create_task(resume_later(node_id))
            resumers.add(task)
            task.add_done_callback(resumers.discard)
    for task in list(resumers):
        task.cancel()


# --- the run ----------------------------------------------------------------------------------


async def scalar(db: psycopg.AsyncConnection[Any], query: str, *args: Any) -> Any:
    async with db.cursor() as cur:
        await cur.execute(query, args or None)
        row = await cur.fetchone()
        return row[0] if row else None


async def soak(stack: Stack, nodes: list[dict[str, Any]], owner_token: str, api_key: str, args: argparse.Namespace) -> dict[str, Any]:
    server = stack.url
    traffic, figures = Traffic(), Chaos()
    stop = asyncio.Event()
    spot_ids = [n["id"] for n in nodes if n["is_spot"]]
    async with await psycopg.AsyncConnection.connect(libpq_url(stack.database_url), autocommit=True) as db:
        memory_start = memory(stack)
        # From here on is the steady state: the swarm starts its figures afresh,
        # and a worker lost before now was lost in the boot storm.
        os.kill(stack.procs["swarm"].pid, signal.SIGUSR1)
        soak_started_at = await scalar(db, "SELECT now()")
        lost_at_boot = await scalar(db, "SELECT count(*) FROM nodes_worker WHERE status = 'lost' OR stop_reason = 'lost'")
        # Idle connections are dropped before uvicorn's 5 s keep-alive closes them under a request.
        connector = aiohttp.TCPConnector(limit=args.streams + 20, keepalive_timeout=3)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=60)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers={"Authorization": f"Bearer {api_key}"}
        ) as streams, aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(keepalive_timeout=3), timeout=aiohttp.ClientTimeout(total=60)
        ) as owners:
            long_lanes = min(LONG_LANES, args.streams // 10)
            lanes = [
                asyncio.create_task(lane(streams, server, traffic, stop, long=i < long_lanes)) for i in range(args.streams)
            ]
            flipper = asyncio.create_task(chaos(owners, server, owner_token, spot_ids, db, figures, stop))
            # This machine's PostgreSQL may run with autovacuum off; production's does not.
            # Heartbeats rewrite every worker row every 5 s, so without vacuum the hot
            # tables bloat and every scan slows: do what autovacuum would, and say so.
            vacuum_every = None if await scalar(db, "SHOW autovacuum") == "on" else VACUUM_EVERY_S
            last_vacuum = time.monotonic()
            began, last_print = time.monotonic(), 0.0
            peak_slots = 0
            while (elapsed := time.monotonic() - began) < args.minutes * 60:
                await asyncio.sleep(1.0)
                if vacuum_every is not None and time.monotonic() - last_vacuum >= vacuum_every:
                    async with db.cursor() as cur:
                        await cur.execute("VACUUM (ANALYZE) nodes_worker, nodes_slot, nodes_node, nodes_command")
                    last_vacuum = time.monotonic()
                slots = await scalar(db, "SELECT count(*) FROM nodes_slot")
                peak_slots = max(peak_slots, slots)
                if elapsed - last_print >= 30:
                    last_print = elapsed
                    draining = await scalar(db, "SELECT count(*) FROM nodes_worker WHERE status = 'draining'")
                    ready = await scalar(db, "SELECT count(*) FROM nodes_worker WHERE status = 'ready'")
                    print(
                        f"soak {elapsed / 60:4.1f} min: {traffic.started:,} requests ({traffic.done:,} done, {traffic.cut} cut, "
                        f"{sum(traffic.refused.values())} refused), {sum(figures.pauses.values())} pauses, "
                        f"{sum(figures.resumes.values())} resumes; now {slots} slots, {ready} ready, {draining} draining",
                        flush=True,
                    )
            stop.set()
            await flipper
            # Whatever is still streaming now is hung up on: the router must release those slots too.
            for task in lanes:
                task.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
        hung_up = time.monotonic()
        leaked = in_flight = None
        while time.monotonic() - hung_up < LEAK_WAIT_S:
            leaked = await scalar(db, "SELECT count(*) FROM nodes_slot")
            in_flight = await scalar(db, "SELECT coalesce(sum(in_flight), 0) FROM nodes_worker")
            if leaked == 0 and in_flight == 0:
                break
            await asyncio.sleep(0.2)
        released_s = time.monotonic() - hung_up
        memory_end = memory(stack)
        db_figures = {
            "reclaims": await scalar(db, "SELECT count(*) FROM nodes_reclaim"),
            "reclaims_finished": await scalar(db, "SELECT count(*) FROM nodes_reclaim WHERE finished_at IS NOT NULL"),
            "drained_workers": await scalar(db, "SELECT count(*) FROM nodes_worker WHERE drain_started_at IS NOT NULL"),
            "stop_reasons": dict(await _rows(db, "SELECT stop_reason, count(*) FROM nodes_worker WHERE status = 'stopped' GROUP BY 1")),
            "requests_cut_db": await scalar(db, "SELECT coalesce(sum(requests_cut), 0) FROM nodes_worker"),
            "lost_at_boot": lost_at_boot,
            "lost_by_node": dict(await _rows(
                db, "SELECT node_id, count(*) FROM nodes_worker WHERE (status = 'lost' OR stop_reason = 'lost') "
                "AND stopped_at >= %s GROUP BY 1", soak_started_at,
            )),
            "late_drains": await scalar(
                db, "SELECT count(*) FROM nodes_worker WHERE drain_deadline IS NOT NULL AND "
                "coalesce(stopped_at, now()) > drain_deadline + interval '2 seconds'"
            ),
            "max_late_s": await scalar(
                db, "SELECT coalesce(max(extract(epoch FROM stopped_at - drain_deadline)), 0) FROM nodes_worker "
                "WHERE stopped_at IS NOT NULL AND drain_deadline IS NOT NULL"
            ),
            "request_log": dict(await _rows(db, "SELECT outcome, count(*) FROM inference_requestlog GROUP BY 1")),
            "db_size_mb": (await scalar(db, "SELECT pg_database_size(current_database())")) / 1e6,
        }
    db_figures["vacuumed_by_soak"] = vacuum_every is not None
    return {
        "traffic": traffic, "chaos": figures, "db": db_figures, "leaked_slots": leaked, "leaked_in_flight": in_flight,
        "released_s": released_s, "peak_slots": peak_slots, "memory_start": memory_start, "memory_end": memory_end,
    }


async def _rows(db: psycopg.AsyncConnection[Any], query: str, *args: Any) -> list[tuple[Any, Any]]:
    async with db.cursor() as cur:
        await cur.execute(query, args or None)
        return [(str(a), b) for a, b in await cur.fetchall()]


def start_fleet(stack: Stack, nodes: list[dict[str, Any]], workdir: Path, *, ramp_s: float) -> tuple[Path, float]:
    """Model servers and the swarm; waits until (nearly) every node has a ready worker. Returns the stats path and the wait."""
    endpoints = []
    for i in range(MODEL_SERVERS):
        port = free_port()
        stack.start_process(f"model-server-{i}", [
            sys.executable, "-m", "simulator.model_server", "--host", "127.0.0.1", "--port", str(port),
            "--model", MODEL, "--tokens-per-s", f"{TOKENS_PER_S:g}",
        ])
        endpoints.append(f"http://127.0.0.1:{port}")
    for endpoint in endpoints:
        port = int(endpoint.rsplit(":", 1)[1])
        wait_until(lambda p=port: port_open("127.0.0.1", p), 30, f"model server on {port}")
    tokens = workdir / "nodes.json"
    tokens.write_text(json.dumps([{"token": n["token"]} for n in nodes]))
    stats = workdir / "swarm-stats.json"
    began = time.monotonic()
    stack.start_process("swarm", [
        sys.executable, "-m", "simulator.swarm", "--server", stack.url, "--nodes", str(tokens),
        "--endpoints", ",".join(endpoints), "--stats", str(stats), "--ramp-s", f"{ramp_s:g}",
    ])
    with stack.db() as conn:
        def fleet_ready() -> bool:
            ready = conn.execute("SELECT count(*) FROM nodes_worker WHERE status = 'ready'").fetchone()[0]
            return ready >= 0.98 * len(nodes)

        wait_until(fleet_ready, ramp_s + 300, "the fleet's workers to be ready", interval=1.0, on_timeout=stack.diagnostics)
    return stats, time.monotonic() - began


def report(
    result: dict[str, Any], swarm: dict[str, Any], args: argparse.Namespace, spot: int, ready_s: float
) -> tuple[str, list[str]]:
    traffic: Traffic = result["traffic"]
    chaos_figures: Chaos = result["chaos"]
    db = result["db"]
    broken = []
    # A worker lost on a node whose heartbeats were all answered within
    # LATE_GAP_S of each other (well inside the expiry) is a false loss.
    late_nodes = swarm.get("late_nodes", {})
    boot = swarm.get("boot", {})
    lost = sum(db["lost_by_node"].values())
    false_lost = sum(n for node, n in db["lost_by_node"].items() if node not in late_nodes)
    if swarm.get("max_gap_s", 0) >= WORKER_EXPIRY_S:
        broken.append(
            f"the soak overloaded this machine: a node's heartbeats were {swarm['max_gap_s']} s apart "
            f"({len(late_nodes)} nodes over {LATE_GAP_S:g} s), longer than the {WORKER_EXPIRY_S:g} s expiry"
        )
    if result["leaked_slots"] or result["leaked_in_flight"]:
        broken.append(f"leaked slots: {result['leaked_slots']} rows, in_flight {result['leaked_in_flight']}")
    if false_lost:
        broken.append(f"false lost workers: {false_lost}")
    if traffic.cut_could_finish:
        broken.append(f"{len(traffic.cut_could_finish)} streams cut that could have finished, e.g. {traffic.cut_could_finish[:3]}")
    if db["late_drains"]:
        broken.append(f"{db['late_drains']} drains ended more than 2 s past their deadline")
    if traffic.incomplete:
        broken.append(f"{len(traffic.incomplete)} streams ended without [DONE] or a cut notice, e.g. {traffic.incomplete[:3]}")
    refused = sum(traffic.refused.values())
    rows = [
        ["fleet", f"{args.nodes:,} nodes ({spot:,} spot), ready in {ready_s:.0f} s", ""],
        ["duration", f"{args.minutes:g} min, {args.streams} concurrent streams ({min(LONG_LANES, args.streams // 10)} long lanes)", ""],
        ["pauses (owner API)", f"{sum(chaos_figures.pauses.values()):,} {dict(chaos_figures.pauses)}, "
                               f"{chaos_figures.pauses_serving:,} on a node serving a stream", ""],
        ["resumes", f"{sum(chaos_figures.resumes.values()):,} {dict(chaos_figures.resumes)}", ""],
        ["owner calls without an answer", f"{sum(chaos_figures.errors.values())} {dict(chaos_figures.errors)}", ""],
        ["drains", f"{db['reclaims']:,} reclaims ({db['reclaims_finished']:,} finished), {db['drained_workers']:,} workers drained", ""],
        ["workers stopped by reason", json.dumps(db["stop_reasons"]), ""],
        ["requests", f"{traffic.started:,} sent, {traffic.done:,} finished with [DONE], {traffic.capped:,} capped for spot", ""],
        ["cut at a deadline", f"{traffic.cut:,} (router counted {db['requests_cut_db']:,})", ""],
        ["cut though they could have finished", len(traffic.cut_could_finish), "must be 0"],
        ["refused (no free slot)", f"{refused:,} {dict(traffic.refused)}", ""],
        ["ended without [DONE] or notice", len(traffic.incomplete), "must be 0"],
        ["hung up at the end", traffic.hung_up_at_end, ""],
        ["time to first chunk p50 / p99", f"{percentile(traffic.first_chunk_ms, 50):.1f} / {percentile(traffic.first_chunk_ms, 99):.1f} ms"
                                           if traffic.first_chunk_ms else "-", ""],
        ["peak slots held", result["peak_slots"], ""],
        ["leaked slots after hang-up", f"{result['leaked_slots']} rows, in_flight {result['leaked_in_flight']} "
                                       f"(checked {result['released_s']:.1f} s after)", "must be 0"],
        ["false lost workers", f"{false_lost} ({lost} lost during the soak; nodes with a heartbeat gap over {LATE_GAP_S:g} s: "
                               f"{len(late_nodes)}; {db['lost_at_boot']} lost in the boot storm before it)", "must be 0"],
        ["drains > 2 s past deadline", f"{db['late_drains']} (latest stop {db['max_late_s']:+.2f} s vs deadline)", "must be 0"],
        ["heartbeats", f"{swarm.get('heartbeats', 0):,}, failures {swarm.get('heartbeat_failures')}, "
                       f"p50 {swarm.get('heartbeat_p50_ms') or 0:.1f} ms, p99 {swarm.get('heartbeat_p99_ms') or 0:.1f} ms, "
                       f"longest gap {swarm.get('max_gap_s')} s", ""],
        ["heartbeats in the boot storm", f"{boot.get('heartbeats', 0):,}, failures {boot.get('heartbeat_failures')}, "
                                         f"p50 {boot.get('heartbeat_p50_ms') or 0:.1f} ms, p99 {boot.get('heartbeat_p99_ms') or 0:.1f} ms, "
                                         f"longest gap {boot.get('max_gap_s')} s; hellos {boot.get('hellos')}, "
                                         f"registrations {boot.get('registrations')}", ""],
        ["agent commands", f"{swarm.get('commands')}, redelivered {swarm.get('redelivered')}, ack failures {swarm.get('ack_failures')}", ""],
        ["request log (router)", json.dumps(db["request_log"]), ""],
        ["database size", f"{db['db_size_mb']:.0f} MB" + (
            f" (autovacuum is off on this server: the soak vacuumed the hot tables every {VACUUM_EVERY_S:g} s)"
            if db["vacuumed_by_soak"] else ""), ""],
    ]
    for name in sorted(set(result["memory_start"]) | set(result["memory_end"])):
        n0, mb0 = result["memory_start"].get(name, (0, 0.0))
        n1, mb1 = result["memory_end"].get(name, (0, 0.0))
        rows.append([f"memory: {name}", f"{mb0:.0f} MB ({n0} proc) -> {mb1:.0f} MB ({n1} proc), {mb1 - mb0:+.0f} MB", ""])
    verdict = "all invariants held" if not broken else "BROKEN: " + "; ".join(broken)
    # Values are sentences, not numbers: left-aligned, unlike bench.table's.
    width = max(len(str(r[0])) for r in rows)
    lines = ["== soak =="] + [f"{r[0]:<{width}}  {r[1]}" + (f"   ({r[2]})" if r[2] else "") for r in rows]
    return "\n".join([*lines, f"  {verdict}"]), broken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=int(os.environ.get("SOAK_NODES", "2000")))
    parser.add_argument("--streams", type=int, default=int(os.environ.get("SOAK_STREAMS", "100")))
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", "10")))
    parser.add_argument("--ramp-s", type=float, default=None, help=f"boot the fleet over this long (default: {BOOT_NODES_PER_S:g} nodes/s)")
    args = parser.parse_args(argv)
    setup_django()
    database_url = fresh_database()
    print(f"soak: creating {args.nodes:,} nodes on {database_url}", flush=True)
    nodes, owner_token, api_key = make_fleet(args.nodes)
    from django.db import connections

    connections.close_all()
    logs = log_dir("soak")
    env = {k: v for k, v in CHILD_ENV.items() if k != "ROUTER_EXPIRY_S"}  # production leases: the guard is part of the soak
    stack = Stack(database_url, bench_broker_url(), env, web_workers=2, log_dir=logs)
    try:
        stack.start(migrate=False)
        ramp_s = args.ramp_s if args.ramp_s is not None else max(5.0, args.nodes / BOOT_NODES_PER_S)
        stats_path, ready_s = start_fleet(stack, nodes, logs, ramp_s=ramp_s)
        print(f"soak: {args.nodes:,} nodes ready in {ready_s:.0f} s; {args.minutes:g} min of traffic and pauses (logs in {logs})", flush=True)
        result = asyncio.run(soak(stack, nodes, owner_token, api_key, args))
        stack.stop_process(stack.procs["swarm"])
        swarm = json.loads(stats_path.read_text()) if stats_path.exists() else {}
        boot = Path(f"{stats_path}.boot")
        swarm["boot"] = json.loads(boot.read_text()) if boot.exists() else {}
    finally:
        stack.stop()
    text, broken = report(result, swarm, args, sum(n["is_spot"] for n in nodes), ready_s)
    print(text, flush=True)
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
