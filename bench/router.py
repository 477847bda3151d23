"""The inference router under load: overhead against the bare worker, against LiteLLM, held streams, leaked slots.

What runs: fake OpenAI-compatible workers (`simulator.model_server`), the web
process (`uvicorn marketplace.asgi:application --workers 2`, DEBUG=false, on
PostgreSQL, so the router's PgStore path) and, for the peer figures, a LiteLLM
proxy (`--num_workers 2`) in a virtualenv of its own under var/ that this
benchmark installs on its first run and reuses after.

1. Overhead. One fast worker (tokens-per-s 0, 1 token: it answers at once)
   measured directly with wrk and through the router, non-streaming and
   streaming (wrk reads the whole chunked SSE answer). Peak requests/s with
   PEAK_CONNECTIONS connections; then the added latency (router minus direct,
   p50/p99) at about half the router's peak: wrk cannot fix a rate and wrk2 is
   not packaged by Debian, so each connection pauses PACED_DELAY_MS between
   requests (wrk's `delay()`), with as many connections as make half the
   router's peak; direct and router get the same paced load. Added time to
   first token: a sequential asyncio client, direct and router alternating.
2. Peer: the same wrk loads through LiteLLM with the same worker as an
   `openai/<model>` deployment.
3. STREAMS concurrent streams through the router to slow workers (each answer
   takes SLOW_TOKENS / SLOW_TOKENS_PER_S seconds); slots sampled every 50 ms,
   the router's own timings read from its request log.
4. Leaks: after every load through the router, and after DISCONNECTS streams
   whose client hangs up after the first chunk, the router is given time to
   settle and the slots left in nodes_slot and nodes_worker.in_flight are
   counted (the router's own releases only: no Celery runs here, so the
   heartbeat guard cannot hide a leak).

Beside requests/s and latencies, each load prints the CPU milliseconds per
request of the proxy, of the bench database's PostgreSQL backends and of the
worker (from /proc), and how much of the machine other processes took
meanwhile: on a shared machine the rates move with the neighbours, CPU per
request hardly does.

The workers are registered ready with an expiry a day ahead (no agent heartbeats
them). Figures only; nothing is asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import CHILD_ENV, bench_broker_url, fresh_database, headline, log_dir, percentile, setup_django, table
from bench.heartbeats import _DONE_LUA
from simulator.procs import free_port
from simulator.stack import ROOT, Stack, group_members, libpq_url, port_open, wait_until

MODEL = "bench-model"  # not a real model's name: LiteLLM would fetch that model's tokenizer from the internet
SLOW_MODEL = "bench-model-slow"
DURATION_S = int(os.environ.get("BENCH_ROUTER_DURATION_S", "4"))
PEAK_CONNECTIONS = int(os.environ.get("BENCH_ROUTER_CONNECTIONS", "64"))
WRK_THREADS = 2
PACED_DELAY_MS = 20
FAST_SLOTS = 256
TTFT_REQUESTS = int(os.environ.get("BENCH_ROUTER_TTFT_REQUESTS", "200"))
STREAMS = int(os.environ.get("BENCH_ROUTER_STREAMS", "2000"))
STREAM_RAMP_S = 2.0
SLOW_WORKERS = 4
SLOW_SLOTS = 600
# 8 s answers: the streams overlap even when opening them takes a few seconds on a busy machine.
SLOW_TOKENS = 16
SLOW_TOKENS_PER_S = 2.0
DISCONNECTS = int(os.environ.get("BENCH_ROUTER_DISCONNECTS", "500"))
SETTLE_MAX_S = 10.0
PEER_ROUNDS = 2
# Pinned to a known good release: 1.82.7 and 1.82.8 (March 2026) were published by an attacker, and 1.107.0 is
# reported so too (all since pulled from PyPI).
LITELLM_SPEC = os.environ.get("BENCH_LITELLM_SPEC", "litellm[proxy]==1.82.6")
LITELLM_VENV = ROOT / "var" / ("bench-" + LITELLM_SPEC.replace("[proxy]", "").replace("==", "-"))

TARGET_RATIO = 3.0
TARGET_ADDED_P50_MS = 2.0
TARGET_ADDED_P99_MS = 10.0

WRK_SCRIPT = r"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %(key)s"
wrk.body = '%(body)s'
"""
# Each connection pauses between requests: the load is a rate, not a closed loop.
WRK_PACING = r"""
local pause_ms = 0
function init(args) pause_ms = tonumber(args[1]) end
function delay() return pause_ms end
"""


def completion_body(*, stream: bool, max_tokens: int, model: str = MODEL) -> str:
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "Say one word."}], "max_tokens": max_tokens, "stream": stream},
        separators=(",", ":"),
    )


# --- processes -------------------------------------------------------------------------


class Children:
    """The processes this benchmark starts beside the Stack; each leads its own process group."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "ab") as log:
            popen = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs[name] = popen
        return popen

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            text = (self.logs / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return " | ".join([line for line in text.splitlines() if line.strip()][-lines:])[-2000:]

    def stop(self, names: list[str] | None = None, timeout_s: float = 8.0) -> list[int]:
        """SIGTERM the groups, SIGKILL what is left after the timeout; returns the pids that survived that."""
        chosen = {n: p for n, p in self.procs.items() if names is None or n in names}
        for popen in chosen.values():
            _killpg(popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(group_members(p.pid) for p in chosen.values()):
            for popen in chosen.values():
                popen.poll()
            time.sleep(0.05)
        survivors = []
        for name, popen in chosen.items():
            _killpg(popen.pid, signal.SIGKILL)
            try:
                popen.wait(5)
            except subprocess.TimeoutExpired:
                pass
            end = time.monotonic() + 5
            while group_members(popen.pid) and time.monotonic() < end:
                time.sleep(0.05)
            survivors += group_members(popen.pid)
            del self.procs[name]
        return survivors


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def start_fake_worker(children: Children, name: str, model: str, *, tokens_per_s: float, default_max_tokens: int) -> str:
    port = free_port()
    argv = [
        sys.executable, "-m", "simulator.model_server", "--port", str(port), "--model", model,
        "--tokens-per-s", str(tokens_per_s), "--default-max-tokens", str(default_max_tokens),
    ]
    popen = children.spawn(name, argv, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wait_until(lambda: popen.poll() is not None or port_open("127.0.0.1", port), 20, f"fake worker {name} on port {port}")
    if popen.poll() is not None:
        raise RuntimeError(f"fake worker {name} exited: {children.log_tail(name)}")
    return f"http://127.0.0.1:{port}"


# --- platform data -------------------------------------------------------------------


def make_models_and_key() -> str:
    from django.contrib.auth import get_user_model

    from inference.keys import create_api_key
    from nodes.models import ServedModel

    user, _ = get_user_model().objects.get_or_create(username="bench-router")
    for name, tps in ((MODEL, 1000.0), (SLOW_MODEL, SLOW_TOKENS_PER_S)):
        ServedModel.objects.get_or_create(name=name, defaults={"min_vram_gb": 16, "typical_tokens_per_s": tps})
    _, raw = create_api_key(user=user, name="bench")
    return raw


def register_workers(model: str, endpoints: list[str], max_slots: int) -> list[str]:
    """Ready on-demand workers (no spot max_tokens cap), unexpired for a day: nothing heartbeats them here."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from nodes.heartbeats import register_worker
    from nodes.models import Worker
    from nodes.services import create_node

    provider, _ = get_user_model().objects.get_or_create(username="bench-provider")
    ids = []
    for i, endpoint in enumerate(endpoints):
        node, _ = create_node(provider=provider, name=f"{model}-{i}", is_spot=False, gpu_model="A100", vram_gb=80)
        ids.append(str(register_worker(node=node, model=model, endpoint=endpoint, max_slots=max_slots).pk))
    Worker.objects.filter(pk__in=ids).update(expires_at=timezone.now() + timedelta(days=1))
    return ids


class Db:
    """A plain autocommit psycopg connection to the bench database (the counts, the sampler)."""

    def __init__(self, database_url: str) -> None:
        import psycopg

        self.url = database_url
        self.conn = psycopg.connect(libpq_url(database_url), autocommit=True)

    def held(self) -> tuple[int, int]:
        row = self.conn.execute(
            "SELECT (SELECT count(*) FROM nodes_slot), (SELECT coalesce(sum(in_flight), 0) FROM nodes_worker)"
        ).fetchone()
        return int(row[0]), int(row[1])

    def outcomes_since(self, since: Any) -> Counter[str]:
        rows = self.conn.execute(
            "SELECT outcome, count(*) FROM inference_requestlog WHERE created_at >= %s GROUP BY outcome", (since,)
        ).fetchall()
        return Counter({outcome: int(n) for outcome, n in rows})

    def router_timings(self, since: Any) -> dict[str, float]:
        """From the router's request log: time to first token and when admission began, p50 and p99 in ms."""
        row = self.conn.execute(
            """
            SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft_ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ttft_ms),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY wait_ms)
            FROM (SELECT ttft_ms, extract(epoch FROM admitted_at - created_at) * 1000 AS wait_ms
                  FROM inference_requestlog WHERE created_at >= %s AND ttft_ms IS NOT NULL) t
            """,
            (since,),
        ).fetchone()
        keys = ("ttft_p50", "ttft_p99", "admit_p50", "admit_p99")
        return {k: float(v) if v is not None else float("nan") for k, v in zip(keys, row or (None,) * 4)}

    def table_state(self) -> str:
        """Size and dead row versions of the tables the router rewrites on every request."""
        parts = []
        for table_name in ("nodes_worker", "nodes_slot"):
            pages, dead, vacuums = self.conn.execute(
                "SELECT pg_relation_size(relid) / current_setting('block_size')::int, n_dead_tup, "
                "autovacuum_count + vacuum_count FROM pg_stat_user_tables WHERE relname = %s",
                (table_name,),
            ).fetchone()
            parts.append(f"{table_name} {pages} pages, {dead} dead row versions, vacuumed {vacuums} times")
        autovacuum = self.conn.execute("SELECT current_setting('autovacuum')").fetchone()[0]
        return "; ".join(parts) + f" (autovacuum is {autovacuum} on this server)"

    def close(self) -> None:
        self.conn.close()


class SlotSampler:
    """Peak slots held (rows in nodes_slot, sum of in_flight), sampled every 50 ms in a thread; also the most
    router statements seen waiting on a lock at once, and the busiest and idlest worker at the peak."""

    def __init__(self, database_url: str) -> None:
        self.url = database_url
        self.peak_slots = 0
        self.peak_in_flight = 0
        self.peak_lock_waits = 0
        self.spread_at_peak: tuple[int, int] = (0, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        db = Db(self.url)
        try:
            while not self._stop.wait(0.05):
                slots, in_flight = db.held()
                self.peak_slots = max(self.peak_slots, slots)
                if in_flight > self.peak_in_flight:
                    self.peak_in_flight = in_flight
                    row = db.conn.execute(
                        "SELECT max(in_flight), min(in_flight) FROM nodes_worker WHERE status = 'ready' AND in_flight > 0"
                    ).fetchone()
                    self.spread_at_peak = (int(row[0] or 0), int(row[1] or 0))
                waits = db.conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                ).fetchone()[0]
                self.peak_lock_waits = max(self.peak_lock_waits, int(waits))
        finally:
            db.close()

    def __enter__(self) -> SlotSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)


def settle(db: Db, phase: str, leaks: list[list[Any]], upstream: list[str] = ()) -> None:
    """Waits until the router has released every slot (or SETTLE_MAX_S), then records what is still held."""
    began = time.monotonic()
    while True:
        slots, in_flight = db.held()
        if (slots == 0 and in_flight == 0) or time.monotonic() - began > SETTLE_MAX_S:
            break
        time.sleep(0.05)
    waited = time.monotonic() - began
    open_upstream = sum(_sim_stats(url).get("in_flight", 0) for url in upstream) if upstream else ""
    verdict = "meets" if slots == 0 and in_flight == 0 else "LEAKS"
    leaks.append([phase, slots, in_flight, open_upstream, f"{waited:.2f}", f"0 and 0: {verdict}"])


def _sim_stats(url: str) -> dict[str, int]:
    import httpx

    try:
        return httpx.get(f"{url}/sim/stats", timeout=2, trust_env=False).json()
    except Exception:
        return {}


# --- CPU accounting ---------------------------------------------------------------------


def _cpu_s(pids: list[int]) -> float:
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime + stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class Meter:
    """CPU time of what serves a load: process groups by name, plus the bench database's backends.

    On a machine shared with other work, requests/s moves with the neighbours;
    CPU milliseconds per request hardly do, so both are printed. `others_pct`
    is what processes outside this benchmark (not the proxy, the workers, the
    bench database's backends, wrk or this process's own client) used meanwhile.
    """

    def __init__(self, db: Db) -> None:
        self.db = db
        self.groups: dict[str, int] = {}  # name -> process group id

    def _postgres_pids(self) -> list[int]:
        rows = self.db.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        return [int(r[0]) for r in rows]

    def snapshot(self, names: list[str]) -> dict[str, Any]:
        snap: dict[str, Any] = {name: _cpu_s(group_members(self.groups[name])) for name in names}
        pids = self._postgres_pids()
        snap["postgres_pids"] = {pid: _cpu_s([pid]) for pid in pids}
        snap["machine"] = _machine_busy_s()
        snap["wall"] = time.monotonic()
        snap["load"] = sum(
            r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF))
        )
        return snap

    def since(self, before: dict[str, Any], names: list[str], requests: int) -> dict[str, float]:
        after = self.snapshot(names)
        per = {name: (after[name] - before[name]) * 1000 / max(requests, 1) for name in names}
        pg_s = sum(cpu - before["postgres_pids"].get(pid, 0.0) for pid, cpu in after["postgres_pids"].items())
        per["postgres"] = pg_s * 1000 / max(requests, 1)
        ours = sum(after[n] - before[n] for n in names) + pg_s + after["load"] - before["load"]
        wall = after["wall"] - before["wall"]
        per["others_pct"] = max(0.0, (after["machine"] - before["machine"] - ours) / (wall * (os.cpu_count() or 1)) * 100)
        return per


# --- wrk -------------------------------------------------------------------------------


class Scripts:
    def __init__(self, work: Path, key: str) -> None:
        self.work = work
        self.key = key

    def path(self, *, stream: bool, paced: bool) -> Path:
        path = self.work / f"{'stream' if stream else 'whole'}{'-paced' if paced else ''}.lua"
        if not path.exists():
            text = WRK_SCRIPT % {"key": self.key, "body": completion_body(stream=stream, max_tokens=1)}
            path.write_text(text + (WRK_PACING if paced else "") + _DONE_LUA)
        return path


def wrk(
    url: str, script: Path, *, connections: int, duration_s: int = DURATION_S, pause_ms: int | None = None,
    meter: Meter | None = None, serving: list[str] = (),
) -> dict[str, Any]:
    """wrk's figures; with a meter, also CPU ms per request of the `serving` groups and PostgreSQL."""
    before = meter.snapshot(list(serving)) if meter else None
    argv = [
        "wrk", f"-t{min(WRK_THREADS, connections)}", f"-c{connections}", f"-d{duration_s}s", "--timeout", "10s",
        "-s", str(script), url + "/v1/chat/completions",
    ]
    if pause_ms is not None:
        argv += ["--", str(pause_ms)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + 60)
    lines = [line for line in out.stdout.splitlines() if line.startswith("WRKJSON ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    result = json.loads(lines[-1].removeprefix("WRKJSON "))
    result["per_s"] = result["requests"] / (result["duration_us"] / 1e6)
    result["errors"] = result["status_errors"] + result["socket_errors"]
    if meter is not None:
        result["cpu"] = meter.since(before, list(serving), result["requests"])
    return result


# --- asyncio clients -------------------------------------------------------------------------


def _run_async(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


async def _stream_once(session: Any, url: str, headers: dict[str, str], body: bytes, *, hang_up_after_first: bool = False) -> dict[str, Any]:
    """One streaming request: status, time to the first SSE data chunk, whether [DONE] arrived."""
    import aiohttp

    began = time.perf_counter()
    result: dict[str, Any] = {"status": None, "ttft": None, "done": False, "error": None, "duration": None}
    try:
        async with session.post(url, data=body, headers=headers) as response:
            result["status"] = response.status
            tail = b""
            async for chunk in response.content.iter_any():
                if result["ttft"] is None and b"data:" in tail + chunk:
                    result["ttft"] = time.perf_counter() - began
                    if hang_up_after_first:
                        response.close()  # the client goes away mid-stream
                        return result
                tail = (tail + chunk)[-32:]
            result["done"] = b"[DONE]" in tail
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        result["error"] = type(exc).__name__
    result["duration"] = time.perf_counter() - began
    return result


async def ttft_pairs(direct: str, router: str, key: str, count: int) -> tuple[list[float], list[float], int]:
    """Sequential streaming requests, direct and router alternating (each leads every other pair); also the failures."""
    import aiohttp

    body = completion_body(stream=True, max_tokens=1).encode()
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    out: dict[str, list[float]] = {direct: [], router: []}
    failed = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for i in range(count + 20):  # the first 20 pairs warm the connections up
            for url in ((direct, router) if i % 2 else (router, direct)):
                r = await _stream_once(session, url + "/v1/chat/completions", headers, body)
                if r["ttft"] is None or not r["done"] or r["status"] != 200:
                    failed += 1
                elif i >= 20:
                    out[url].append(r["ttft"])
    return out[direct], out[router], failed


async def many_streams(url: str, key: str, count: int, *, ramp_s: float, hang_up_after_first: bool) -> list[dict[str, Any]]:
    """`count` concurrent streaming requests, opened over `ramp_s` seconds."""
    import aiohttp

    body = completion_body(stream=True, max_tokens=SLOW_TOKENS, model=SLOW_MODEL).encode()
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120, sock_connect=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = []
        batch = 50
        for start in range(0, count, batch):
            for _ in range(min(batch, count - start)):
                tasks.append(asyncio.create_task(
                    _stream_once(session, url + "/v1/chat/completions", headers, body, hang_up_after_first=hang_up_after_first)
                ))
            await asyncio.sleep(ramp_s * batch / count)
        return await asyncio.gather(*tasks)


# --- LiteLLM ---------------------------------------------------------------------------------


def litellm_installed() -> tuple[Path | None, str]:
    """The LiteLLM virtualenv: reused when a finished install is there, else made now. (path, how) or (None, why not)."""
    litellm = LITELLM_VENV / "bin" / "litellm"
    marker = LITELLM_VENV / ".bench-installed"
    if marker.exists() and litellm.exists() and marker.read_text().strip() == LITELLM_SPEC:
        return LITELLM_VENV, "cached venv"
    shutil.rmtree(LITELLM_VENV, ignore_errors=True)
    began = time.monotonic()
    python = shutil.which("python3") or sys.executable
    try:
        made = subprocess.run([python, "-m", "venv", str(LITELLM_VENV)], capture_output=True, text=True, timeout=120)
        if made.returncode != 0:
            return None, f"`python3 -m venv` failed: {made.stderr.strip()[-300:]}"
        pip = subprocess.run(
            [str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", LITELLM_SPEC],
            capture_output=True, text=True, timeout=900,
        )
    except subprocess.TimeoutExpired as exc:
        return None, f"installing {LITELLM_SPEC} timed out after {exc.timeout:.0f} s"
    if pip.returncode != 0 or not litellm.exists():
        errors = [line for line in pip.stderr.splitlines() if not line.startswith("WARNING: Location")]
        return None, f"`pip install {LITELLM_SPEC}` failed ({pip.returncode}): {' '.join(errors)[-400:]}"
    marker.write_text(LITELLM_SPEC)
    return LITELLM_VENV, f"installed now in {time.monotonic() - began:.0f} s"


def start_litellm(children: Children, venv: Path, worker_url: str, work: Path) -> tuple[str | None, str]:
    """LiteLLM proxy on the same worker: (url, its master key), or (None, why it did not start)."""
    port = free_port()
    home = work / "litellm-home"
    home.mkdir(exist_ok=True)
    master_key = "sk-bench-litellm"
    config = work / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {worker_url}/v1\n"
        "      api_key: sk-unused\n"
        "litellm_settings:\n"
        "  set_verbose: false\n"
        "  telemetry: false\n"
        "general_settings:\n"
        f"  master_key: {master_key}\n"
        "  disable_spend_logs: true\n"
    )
    # As our web process runs: no access log.
    log_config = work / "litellm-log.json"
    log_config.write_text(json.dumps({
        "version": 1, "disable_existing_loggers": False,
        "handlers": {"default": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "WARNING"},
            "uvicorn.error": {"level": "WARNING"},
            "uvicorn.access": {"handlers": ["default"], "level": "WARNING", "propagate": False},
        },
    }))
    # A clean environment: no database (so no Prisma, no UI data), no telemetry, no network look-ups.
    env = {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
        "LITELLM_LOG": "ERROR", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1", "NO_DOCS": "True",
    }
    argv = [
        str(venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
        "--num_workers", "2", "--telemetry", "False", "--log_config", str(log_config),
    ]
    popen = children.spawn("litellm", argv, env=env, cwd=work)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            return None, f"litellm exited with {popen.returncode}: {children.log_tail('litellm')}"
        try:
            if httpx.get(f"{url}/health/liveliness", timeout=1, trust_env=False).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    else:
        return None, f"litellm did not answer /health/liveliness within 120 s: {children.log_tail('litellm')}"
    # One real completion of each kind, so a misconfiguration shows as a reason, not as a figure.
    for stream in (False, True):
        response = httpx.post(
            f"{url}/v1/chat/completions", content=completion_body(stream=stream, max_tokens=1),
            headers={"authorization": f"Bearer {master_key}", "content-type": "application/json"}, timeout=30, trust_env=False,
        )
        if response.status_code != 200 or (stream and b"[DONE]" not in response.content):
            return None, f"litellm answered {response.status_code} to a {'streaming ' if stream else ''}completion: {response.text[:300]}"
    return url, master_key


# --- the benchmark ---------------------------------------------------------------------------------


def _ms(us: float) -> float:
    return us / 1000


def run() -> str:
    started = time.monotonic()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the children inherit it too
    setup_django()
    database_url = fresh_database()
    key = make_models_and_key()
    logs = log_dir("router")
    work = Path(tempfile.mkdtemp(prefix="bench-router-"))
    children = Children(logs)
    stack = Stack(
        database_url, bench_broker_url(), CHILD_ENV, web_workers=2, processes=("web",), flush_broker=False, log_dir=logs
    )
    report, survivors = "", []
    try:
        fast = start_fake_worker(children, "fast-worker", MODEL, tokens_per_s=0, default_max_tokens=1)
        slow = [
            start_fake_worker(children, f"slow-worker-{i}", SLOW_MODEL, tokens_per_s=SLOW_TOKENS_PER_S, default_max_tokens=SLOW_TOKENS)
            for i in range(SLOW_WORKERS)
        ]
        register_workers(MODEL, [fast], FAST_SLOTS)
        register_workers(SLOW_MODEL, slow, SLOW_SLOTS)
        from django.db import connections

        connections.close_all()
        stack.start(migrate=False)
        db = Db(database_url)
        try:
            run = Run(db, stack, children, fast, slow, key, work)
            report = run.measure()
        finally:
            db.close()
    finally:
        survivors = children.stop()
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)
    tail = f"benchmark {time.monotonic() - started:.0f} s; process logs in {logs}"
    if survivors:
        tail += f"\n  !! processes survived SIGKILL: {survivors}"
    return f"{report}\n  {tail}"


class Run:
    """One run's processes, figures and leak checks."""

    def __init__(self, db: Db, stack: Stack, children: Children, fast: str, slow: list[str], key: str, work: Path) -> None:
        self.db, self.stack, self.children = db, stack, children
        self.router, self.fast, self.slow, self.key, self.work = stack.url, fast, slow, key, work
        self.scripts = Scripts(work, key)
        self.meter = Meter(db)
        self.meter.groups = {"router": stack.procs["web"].pid, "worker": children.procs["fast-worker"].pid}
        self.leaks: list[list[Any]] = []
        self.peak: dict[tuple[str, bool], dict[str, Any]] = {}
        self.paced: dict[tuple[str, bool], dict[str, Any]] = {}
        self.paced_conns: dict[bool, int] = {}
        self.peer_note = ""

    def wrk(self, target: str, stream: bool, *, paced: bool = False, connections: int = PEAK_CONNECTIONS, **kw: Any) -> dict[str, Any]:
        url, serving, scripts = {
            "direct": (self.fast, ["worker"], self.scripts),
            "router": (self.router, ["router", "worker"], self.scripts),
            "litellm": (getattr(self, "litellm_url", ""), ["litellm", "worker"], getattr(self, "litellm_scripts", None)),
        }[target]
        script = scripts.path(stream=stream, paced=paced)
        return wrk(url, script, connections=connections, meter=self.meter, serving=serving,
                   pause_ms=PACED_DELAY_MS if paced else None, **kw)

    def settle(self, phase: str, upstream: list[str]) -> None:
        settle(self.db, phase, self.leaks, upstream)

    def measure(self) -> str:
        # Warm-up: imports, pools, keep-alive connections, key and model caches of both web workers.
        for stream in (False, True):
            for target in ("direct", "router"):
                self.wrk(target, stream, duration_s=1)
        self.settle("warm-up", [self.fast])

        # 1. Peak requests/s, direct and through the router.
        for stream in (False, True):
            self.peak["direct", stream] = self.wrk("direct", stream)
            self.peak["router", stream] = self.wrk("router", stream)
            self.settle(f"router at peak, {_kind(stream)}", [self.fast])

        # Added latency at about half the router's peak: the same paced load, direct and through the router.
        for stream in (False, True):
            target = self.peak["router", stream]["per_s"] / 2
            # A connection makes one request per pause plus its answer's time; one short run corrects the guess.
            conns = max(2, round(target * (PACED_DELAY_MS + 1) / 1000))
            probe = self.wrk("router", stream, paced=True, connections=conns, duration_s=2)
            conns = max(2, round(conns * target / max(probe["per_s"], 1.0)))
            self.paced_conns[stream] = conns
            self.paced["direct", stream] = self.wrk("direct", stream, paced=True, connections=conns)
            self.paced["router", stream] = self.wrk("router", stream, paced=True, connections=conns)
            self.settle(f"router at half its peak, {_kind(stream)}", [self.fast])

        # Added time to first token, sequential.
        self.ttft_direct, self.ttft_router, self.ttft_failed = _run_async(ttft_pairs(self.fast, self.router, self.key, TTFT_REQUESTS))
        self.settle("time-to-first-token pairs", [self.fast])

        # 2. LiteLLM on the same worker, the same wrk loads (then stopped: the streams below get the CPUs).
        self.peer = self.measure_litellm()
        if self.peer:
            self.settle("router runs beside LiteLLM", [self.fast])

        # 3. Concurrent streams held through the router.
        from django.utils import timezone

        since = timezone.now()
        self.meter.groups.update({f"slow-{i}": self.children.procs[f"slow-worker-{i}"].pid for i in range(SLOW_WORKERS)})
        serving = ["router", *(f"slow-{i}" for i in range(SLOW_WORKERS))]
        before = self.meter.snapshot(serving)
        with SlotSampler(self.db.url) as sampler:
            began = time.monotonic()
            self.streams = _run_async(many_streams(self.router, self.key, STREAMS, ramp_s=STREAM_RAMP_S, hang_up_after_first=False))
            self.streams_s = time.monotonic() - began
        self.streams_cpu = self.meter.since(before, serving, len(self.streams))
        self.sampler = sampler
        self.settle(f"{STREAMS:,} concurrent streams", self.slow)
        time.sleep(0.6)  # the request log is flushed every 0.25 s
        self.router_timings = self.db.router_timings(since)
        self.streams_outcomes = self.db.outcomes_since(since)

        # 4. Clients hanging up after the first chunk.
        since = timezone.now()
        self.hung_up = _run_async(many_streams(self.router, self.key, DISCONNECTS, ramp_s=STREAM_RAMP_S / 2, hang_up_after_first=True))
        self.settle(f"{DISCONNECTS} clients hung up after the first chunk", self.slow)
        time.sleep(0.6)
        self.outcomes = self.db.outcomes_since(since)
        self.tables = self.db.table_state()
        return self.report()

    def measure_litellm(self) -> dict[tuple[str, bool], dict[str, Any]]:
        venv, how = litellm_installed()
        if venv is None:
            self.peer_note = f"LiteLLM could not be installed: {how}"
            return {}
        url, secret = start_litellm(self.children, venv, self.fast, self.work)
        if url is None:
            self.peer_note = f"LiteLLM did not start ({how}): {secret}"
            return {}
        self.peer_note = how
        self.litellm_url = url
        self.litellm_scripts = Scripts(self.work / "litellm", secret)
        self.litellm_scripts.work.mkdir(exist_ok=True)
        self.meter.groups["litellm"] = self.children.procs["litellm"].pid
        peer = {}
        try:
            for stream in (False, True):
                self.wrk("litellm", stream, duration_s=2)  # its first requests are slow
            for stream in (False, True):
                # Side by side, twice, best of each: the neighbours only ever lower a rate, and a ratio of two
                # figures taken minutes apart on a shared machine would measure them as much as the proxies.
                for _ in range(PEER_ROUNDS):
                    for target in ("router", "litellm"):
                        r = self.wrk(target, stream)
                        if (target, stream) not in peer or r["per_s"] > peer[target, stream]["per_s"]:
                            peer[target, stream] = r
                peer["litellm-paced", stream] = self.wrk("litellm", stream, paced=True, connections=self.paced_conns[stream])
        finally:
            self.children.stop(["litellm"])
        return peer

    # --- the report ------------------------------------------------------------------------

    def report(self) -> str:
        return "\n\n".join([self.report_overhead(), self.report_peer(), self.report_streams(), self.report_leaks()])

    def _added(self, target: str, stream: bool) -> tuple[float, float]:
        d, r = self.paced["direct", stream], (self.paced if target == "router" else self.peer)[
            ("router" if target == "router" else "litellm-paced"), stream]
        return _ms(r["p50_us"] - d["p50_us"]), _ms(r["p99_us"] - d["p99_us"])

    def report_overhead(self) -> str:
        rows, others = [], []
        for stream in (False, True):
            d, r = self.peak["direct", stream], self.peak["router", stream]
            pd, pr = self.paced["direct", stream], self.paced["router", stream]
            a50, a99 = self._added("router", stream)
            ok = a50 <= TARGET_ADDED_P50_MS and a99 <= TARGET_ADDED_P99_MS
            rows += [
                _row(f"{_kind(stream)}: direct", d, "worker", "", ""),
                _row(f"{_kind(stream)}: router", r, "router", f"{r['per_s'] / d['per_s']:.2f}", ""),
                _row(f"{_kind(stream)}: direct, paced", pd, "worker", "", ""),
                _row(f"{_kind(stream)}: router, paced", pr, "router", f"{pr['per_s'] / r['per_s']:.0%} of its peak",
                     f"p50 {a50:+.2f} ms, p99 {a99:+.2f} ms (<= {TARGET_ADDED_P50_MS:g} / {TARGET_ADDED_P99_MS:g}: "
                     f"{'meets' if ok else 'MISSES'})"),
            ]
            others += [x["cpu"]["others_pct"] for x in (d, r, pd, pr)]
            headline("router", f"{_kind(stream)}: router requests/s at peak", r["per_s"], "req/s")
            headline("router", f"{_kind(stream)}: router / direct requests/s at peak", r["per_s"] / d["per_s"], "x")
            headline("router", f"{_kind(stream)}: added latency at half peak, p50", a50, "ms",
                     target=f"<= {TARGET_ADDED_P50_MS:g} ms", met=a50 <= TARGET_ADDED_P50_MS)
            headline("router", f"{_kind(stream)}: added latency at half peak, p99", a99, "ms",
                     target=f"<= {TARGET_ADDED_P99_MS:g} ms", met=a99 <= TARGET_ADDED_P99_MS)
        t_d, t_r = sorted(self.ttft_direct), sorted(self.ttft_router)
        t50 = (percentile(t_r, 50) - percentile(t_d, 50)) * 1000
        t99 = (percentile(t_r, 99) - percentile(t_d, 99)) * 1000
        headline("router", "added time to first SSE chunk, p50", t50, "ms")
        headline("router", "added time to first SSE chunk, p99", t99, "ms")
        return table(
            "Router overhead: one fake worker (tokens-per-s 0, 1 token), direct and through the router",
            ["load", "requests/s", "p50 ms", "p99 ms", "errors", "CPU ms/req: proxy", "PostgreSQL", "worker",
             "router/direct, load", "added latency (router - direct)"],
            rows,
            [
                f"peak: wrk -t{WRK_THREADS} -c{PEAK_CONNECTIONS} -d{DURATION_S}s. paced: every connection pauses {PACED_DELAY_MS} ms "
                f"before each request (wrk's delay(); wrk2 is not packaged by Debian), {self.paced_conns[False]} connections "
                f"non-streaming and {self.paced_conns[True]} streaming: about half the router's peak, the same load direct and routed",
                f"time to first SSE chunk, {len(t_d)} sequential requests each (asyncio client, direct and router alternating): "
                f"direct p50 {percentile(t_d, 50) * 1000:.2f} ms, p99 {percentile(t_d, 99) * 1000:.2f} ms; router p50 "
                f"{percentile(t_r, 50) * 1000:.2f} ms, p99 {percentile(t_r, 99) * 1000:.2f} ms; added p50 {t50:+.2f} ms, p99 {t99:+.2f} ms"
                + (f"; {self.ttft_failed} requests failed (left out)" if self.ttft_failed else ""),
                f"router: uvicorn marketplace.asgi:application --workers 2, DEBUG=false, PgStore on PostgreSQL; the worker has "
                f"{FAST_SLOTS} slots. CPU ms/req: CPU time of the proxy's processes, of the bench database's PostgreSQL "
                f"backends and of the fake worker, per request",
                f"wrk, the worker, the proxy and PostgreSQL share {os.cpu_count()} CPUs; processes outside this benchmark used "
                f"{statistics.fmean(others):.0f}% of them on average during these runs (max {max(others):.0f}%)",
            ],
        )

    def report_peer(self) -> str:
        if not self.peer:
            for stream in (False, True):
                headline("router", f"{_kind(stream)}: router vs LiteLLM requests/s", "not measured",
                         target=f">= {TARGET_RATIO:g}x")
            return f"== Peer: LiteLLM ==\n  NOT MEASURED: {self.peer_note}"
        rows, cpu_notes = [], []
        for stream in (False, True):
            r, lp = self.peer["router", stream], self.peer["litellm", stream]
            ours = r["cpu"]["router"] + r["cpu"]["postgres"]
            theirs = lp["cpu"]["litellm"] + lp["cpu"]["postgres"]
            cpu_notes.append(f"{_kind(stream)} ours {ours:.2f} ms, LiteLLM {theirs:.2f} ms ({theirs / max(ours, 1e-9):.1f}x)")
            ratio = r["per_s"] / lp["per_s"] if lp["per_s"] else float("inf")
            headline("router", f"{_kind(stream)}: router vs LiteLLM requests/s", ratio, "x",
                     target=f">= {TARGET_RATIO:g}x", met=ratio >= TARGET_RATIO)
            la50, la99 = self._added("litellm", stream)
            a50, a99 = self._added("router", stream)
            rows += [
                _row(f"{_kind(stream)}: router", r, "router", ""),
                _row(f"{_kind(stream)}: LiteLLM", lp, "litellm",
                     f"ours {ratio:.1f}x (>= {TARGET_RATIO:g}x: {'meets' if ratio >= TARGET_RATIO else 'MISSES'})"),
                _row(f"{_kind(stream)}: LiteLLM, paced", self.peer["litellm-paced", stream], "litellm",
                     f"adds p50 {la50:+.2f} ms, p99 {la99:+.2f} ms: {_ratio(la50, a50)} / {_ratio(la99, a99)} what ours adds"),
            ]
        return table(
            f"Peer: LiteLLM proxy ({LITELLM_SPEC}, --num_workers 2) on the same worker, the same wrk loads, side by side",
            ["load", "requests/s", "p50 ms", "p99 ms", "errors", "CPU ms/req: proxy", "PostgreSQL", "worker", "router vs LiteLLM"],
            rows,
            [
                f"LiteLLM {self.peer_note} ({LITELLM_VENV}); config: one openai/{MODEL} deployment, a master key, no database, "
                "spend logs off, telemetry off, no access log",
                f"router and LiteLLM rows: wrk -c{PEAK_CONNECTIONS} runs alternating router, LiteLLM, {PEER_ROUNDS} rounds, "
                "best of each; paced: the router's paced load; adds: LiteLLM's paced latency minus the direct paced latency above",
                "proxy CPU per request at peak (PostgreSQL included, the figure that moves least with the neighbours): "
                + "; ".join(cpu_notes),
            ],
        )

    def report_streams(self) -> str:
        results = self.streams
        done = sum(1 for r in results if r["done"])
        statuses = Counter(r["status"] for r in results)
        errors = Counter(r["error"] for r in results if r["error"])
        ttfts = sorted(r["ttft"] * 1000 for r in results if r["ttft"] is not None)
        durations = sorted(r["duration"] for r in results if r["done"])
        rt = self.router_timings
        headline("router", "concurrent streams that ended with [DONE]", done, f"of {STREAMS:,}",
                 target=f"all {STREAMS:,}", met=done == STREAMS)
        return table(
            f"{STREAMS:,} concurrent streams through the router ({SLOW_WORKERS} workers x {SLOW_SLOTS} slots, "
            f"{SLOW_TOKENS} tokens at {SLOW_TOKENS_PER_S:g}/s = {SLOW_TOKENS / SLOW_TOKENS_PER_S:g} s each)",
            ["streams", "with [DONE]", "TTFT p50 ms", "TTFT p99 ms", "router: TTFT p50", "p99", "admission began p50", "p99",
             "duration p50 s", "p99 s", "peak slots", "peak in_flight", "target"],
            [[STREAMS, done, percentile(ttfts, 50), percentile(ttfts, 99), rt["ttft_p50"], rt["ttft_p99"], rt["admit_p50"],
              rt["admit_p99"], percentile(durations, 50), percentile(durations, 99), self.sampler.peak_slots,
              self.sampler.peak_in_flight, f"{STREAMS:,} held: {'meets' if done == STREAMS else 'MISSES'}"]],
            [
                f"opened over {STREAM_RAMP_S:g} s by one asyncio client (aiohttp, uvloop), {self.streams_s:.1f} s in all; HTTP "
                f"statuses {dict(statuses)}" + (f"; client errors {dict(errors)}" if errors else "")
                + f"; request log outcomes {dict(self.streams_outcomes)}",
                f"CPU per stream: router {self.streams_cpu['router']:.2f} ms, PostgreSQL {self.streams_cpu['postgres']:.2f} ms; "
                f"processes outside this benchmark used {self.streams_cpu['others_pct']:.0f}% of the CPUs meanwhile",
                "TTFT: from the request to the first SSE data chunk, as the client saw it; router TTFT: the same from the "
                "router's request log (ttft_ms: admission, upstream request, first chunk)",
                "router: from its request log; TTFT from the request to the first chunk forwarded; admission began: from the "
                "request to the slot's acquired_at, the admission statement's now(), i.e. when PostgreSQL began it (waits for a "
                "pooled connection included, its own lock waits not)",
                f"peak slots: rows in nodes_slot and the sum of nodes_worker.in_flight, sampled every 50 ms; at the peak the "
                f"busiest worker held {self.sampler.spread_at_peak[0]} and the idlest {self.sampler.spread_at_peak[1]}; at most "
                f"{self.sampler.peak_lock_waits} PostgreSQL sessions were seen waiting on a lock at once",
            ],
        )

    def report_leaks(self) -> str:
        first = sum(1 for r in self.hung_up if r["ttft"] is not None)
        leaky = sum(1 for _, slots, in_flight, *_ in self.leaks if slots or in_flight)
        headline("router", "loads after which slots stayed held (leaks)", leaky, f"of {len(self.leaks)}",
                 target="0", met=leaky == 0)
        return table(
            f"Leaked slots after each load (the router given up to {SETTLE_MAX_S:g} s to settle)",
            ["after", "nodes_slot rows", "sum in_flight", "streams open on workers", "settled in s", "target"],
            self.leaks,
            [
                f"hang-ups: {first}/{DISCONNECTS} clients got a first chunk, then closed the connection; request log outcomes "
                f"{dict(self.outcomes)}",
                "streams open on workers: the fake workers' own count of unfinished answers (/sim/stats), so whether the router "
                "also let go of the upstream request; no Celery runs, so no heartbeat guard releases anything here",
                f"tables after the run: {self.tables}",
            ],
        )


def _kind(stream: bool) -> str:
    return "streaming" if stream else "non-streaming"


def _row(label: str, r: dict[str, Any], proxy: str, *extra: str) -> list[Any]:
    cpu = r["cpu"]
    return [
        label, r["per_s"], _ms(r["p50_us"]), _ms(r["p99_us"]), r["errors"],
        f"{cpu[proxy]:.3f}" if proxy != "worker" else "", f"{cpu['postgres']:.3f}" if proxy != "worker" else "",
        f"{cpu['worker']:.3f}", *extra,
    ]


def _ratio(peer_ms: float, ours_ms: float) -> str:
    if ours_ms <= 0:
        return "n/a (ours adds nothing measurable)"
    return f"{peer_ms / ours_ms:.1f}x"


if __name__ == "__main__":
    print(run())
