"""The real processes of the platform, started and stopped for e2e tests, benchmarks and demos.

    with Stack(database_url, broker_url, {"DRAIN_CEILING_S": "8"}) as stack:
        stack.manage("seed_demo")
        token = stack.api().post("/api/v1/auth/token", json={...}).json()["token"]
        stack.start_agent(agent_token, vram_gb=80)

No Django import here, on purpose: the process that drives a stack is either a
pytest process whose Django is bound to pytest-django's *test* database, or a
benchmark that configures Django itself. The stack's processes get everything
through their environment (DATABASE_URL, CELERY_BROKER_URL, the overrides), so
the driver talks to them the way clients do: over HTTP, plus a plain psycopg
connection (`Stack.db()`) for set-up and assertions the API does not offer.

More children when a test needs them: `start_web(env)` (another web process with
settings of its own, on another port), `start_process` (model servers, ...);
`kill_process` SIGKILLs one group at once, a crash rather than a stop.

Every child runs in its own session (so its own process group): stopping a
child SIGTERMs the whole group, which also reaches what it forked (uvicorn's
workers, Celery's pool, the agent's model servers), then SIGKILLs what is left
after a timeout, and `stop()` verifies that no process of any group survives.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
from psycopg import sql

from simulator.procs import free_port

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = ("web", "worker", "beat")
T = TypeVar("T")


class StackError(RuntimeError):
    """A process of the stack did not start, or did not stop."""


# --- databases and broker ------------------------------------------------------


def database_name(url: str) -> str:
    name = urlsplit(url).path.lstrip("/")
    if not name:
        raise ValueError(f"no database name in {url!r}")
    return name


def with_database_name(url: str, name: str) -> str:
    """The same server and credentials, another database."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def libpq_url(url: str) -> str:
    """The URL as libpq spells it."""
    # dj-database-url accepts postgres://, postgresql:// and postgis://; libpq only the first two.
    parts = urlsplit(url)
    scheme = "postgresql" if parts.scheme in ("postgres", "postgresql", "pgsql", "postgis") else parts.scheme
    return urlunsplit((scheme, parts.netloc, parts.path, parts.query, parts.fragment))


def _maintenance(url: str) -> psycopg.Connection[Any]:
    # CREATE/DROP DATABASE cannot run inside a transaction block: autocommit.
    return psycopg.connect(libpq_url(with_database_name(url, "postgres")), autocommit=True)


def create_database(url: str, *, drop_existing: bool = False) -> bool:
    """Creates the PostgreSQL database named in `url` if missing; True if it created it."""
    name = database_name(url)
    with _maintenance(url) as conn:
        if drop_existing:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists:
            return False
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return True


def drop_database(url: str) -> None:
    """Drops the database, ending the sessions still connected to it (PostgreSQL 13+)."""
    with _maintenance(url) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database_name(url))))


def flush_redis(url: str) -> None:
    """Empties the Redis database of `url`: stale tasks of an earlier run must not reach this one."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


# --- processes -----------------------------------------------------------------


@dataclass
class Proc:
    """One child of the stack, leader of its own process group."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log: Any = field(repr=False, default=None)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class WebProc:
    """An extra web process of the stack (`Stack.start_web`) and its base URL."""

    proc: Proc
    url: str


def pid_alive(pid: int) -> bool:
    """False once the process is gone or a zombie (a container's PID 1 may never reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, read from /proc (no psutil needed)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        # After the comm field: state, ppid, pgrp.
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def port_open(host: str, port: int, timeout: float = 0.3) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(
    predicate: Callable[[], T], timeout: float, what: str, *, interval: float = 0.05, on_timeout: Callable[[], str] | None = None
) -> T:
    """Polls `predicate` until it returns something truthy; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{on_timeout()}" if on_timeout else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{extra}")
        time.sleep(interval)


def _reap(proc: Proc) -> list[int]:
    """After a SIGKILL to its group: wait for the process group to go, close its log; the pids left."""
    try:
        proc.popen.wait(5)
    except subprocess.TimeoutExpired:
        pass
    # SIGKILL is asynchronous: give the kernel a moment before calling it a survivor.
    end = time.monotonic() + 5
    while group_members(proc.pid) and time.monotonic() < end:
        time.sleep(0.02)
    if proc._log is not None:
        proc._log.close()
        proc._log = None
    return group_members(proc.pid)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _agent_args(args: Mapping[str, Any]) -> list[str]:
    """`vram_gb=80` -> `--vram-gb 80`; True -> a bare flag; None/False -> left out."""
    argv: list[str] = []
    for key, value in args.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        argv.extend([flag] if value is True else [flag, str(value)])
    return argv


class Stack:
    """web (uvicorn), Celery worker and Celery beat on one database and one broker."""

    def __init__(
        self,
        database_url: str,
        broker_url: str,
        env_overrides: Mapping[str, Any] | None = None,
        web_workers: int = 1,
        *,
        log_dir: str | Path | None = None,
        processes: Iterable[str] = PROCESSES,
        celery_concurrency: int = 2,
        fresh_database: bool = False,
        drop_database_on_stop: bool = False,
        flush_broker: bool = True,
        host: str = "127.0.0.1",
        stop_timeout_s: float = 10.0,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.database_url = database_url
        self.broker_url = broker_url
        self.env_overrides = {k: str(v) for k, v in (env_overrides or {}).items()}
        self.web_workers = web_workers
        self.processes = tuple(processes)
        unknown = set(self.processes) - set(PROCESSES)
        if unknown:
            raise ValueError(f"unknown processes {sorted(unknown)}; choose from {PROCESSES}")
        self.celery_concurrency = celery_concurrency
        self.fresh_database = fresh_database
        self.drop_database_on_stop = drop_database_on_stop
        self.flush_broker = flush_broker
        self.host = host
        self.stop_timeout_s = stop_timeout_s
        self.start_timeout_s = start_timeout_s
        # Scratch (beat schedule, VAR_DIR) goes with stop(); logs stay for a post-mortem.
        self.tmp_dir = Path(tempfile.mkdtemp(prefix="marketplace-stack-"))
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="marketplace-stack-logs-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.port: int | None = None
        self.procs: dict[str, Proc] = {}
        self.agents: list[Proc] = []
        self._started = False

    # --- environment ---------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """What every child gets: the parent's environment, the stack's URLs, the overrides."""
        env = dict(os.environ)
        env.update(
            {
                "DATABASE_URL": self.database_url,
                "CELERY_BROKER_URL": self.broker_url,
                "DEBUG": "true",
                # Keeps the children's files (beat schedule, broker dirs, static) out of the checkout.
                "VAR_DIR": str(self.tmp_dir / "var"),
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
            }
        )
        # The driver may be a pytest process: do not let it leak test-only switches into the children.
        env.pop("CELERY_TASK_ALWAYS_EAGER", None)
        env.pop("DJANGO_SETTINGS_MODULE", None)
        env.update(self.env_overrides)
        return env

    @property
    def url(self) -> str:
        if self.port is None:
            raise StackError("the web process is not started")
        return f"http://{self.host}:{self.port}"

    # --- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self, *, migrate: bool = True) -> Stack:
        """Database (created if missing), migrations, then web, worker and beat; waits for /healthz."""
        self._started = True
        self.tmp_dir.mkdir(parents=True, exist_ok=True)  # a stack may be started again after stop()
        try:
            create_database(self.database_url, drop_existing=self.fresh_database)
            if self.flush_broker and self.broker_url.startswith("redis"):
                flush_redis(self.broker_url)
            if migrate:
                self.migrate()
            if "web" in self.processes:
                self.port = free_port(self.host)
                self._spawn(
                    "web",
                    [
                        sys.executable, "-m", "uvicorn", "marketplace.asgi:application",
                        "--host", self.host, "--port", str(self.port),
                        "--workers", str(self.web_workers),
                        "--no-access-log", "--log-level", "warning",
                        "--timeout-graceful-shutdown", "3",
                    ],
                )
            if "worker" in self.processes:
                self._spawn(
                    "worker",
                    [
                        sys.executable, "-m", "celery", "-A", "marketplace", "worker",
                        "--loglevel", "info", "--concurrency", str(self.celery_concurrency),
                        "--hostname", f"stack-{os.getpid()}-{id(self):x}@%h",
                        # One worker per stack: gossip and mingle only slow its start-up.
                        "--without-gossip", "--without-mingle",
                    ],
                )
            if "beat" in self.processes:
                self._spawn(
                    "beat",
                    [
                        sys.executable, "-m", "celery", "-A", "marketplace", "beat",
                        "--loglevel", "info", "--schedule", str(self.tmp_dir / "celerybeat-schedule"),
                    ],
                )
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self) -> None:
        """Until /healthz answers and the Celery worker has said it is ready."""
        if "web" in self.processes:
            wait_until(self._healthy, self.start_timeout_s, "the web process to answer /healthz", on_timeout=self.diagnostics)
        if "worker" in self.processes:
            # Tasks enqueued before this are not lost (they wait in Redis), but
            # a benchmark timing them must not count the worker's start-up.
            wait_until(
                lambda: self._check_alive() and " ready." in self.procs["worker"].log_path.read_text(errors="replace"),
                self.start_timeout_s,
                "the Celery worker to be ready",
                interval=0.1,
                on_timeout=self.diagnostics,
            )

    def _healthy(self) -> bool:
        self._check_alive()
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1.0, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def _check_alive(self) -> bool:
        for proc in self.procs.values():
            if not proc.alive():
                raise StackError(f"{proc.name} exited with code {proc.popen.returncode}\n{self.diagnostics()}")
        return True

    def _spawn(
        self, name: str, argv: list[str], *, registry: list[Proc] | None = None, env: Mapping[str, str] | None = None
    ) -> Proc:
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - closed in _stop_proc
        popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=self.env if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so stop() reaches its children too
        )
        proc = Proc(name, popen, log_path, log)
        if registry is None:
            self.procs[name] = proc
        else:
            registry.append(proc)
        return proc

    def start_agent(self, token: str, **args: Any) -> Proc:
        """`python -m simulator.agent --server <url> --token <token>` plus `args` as flags."""
        name = f"agent-{len(self.agents) + 1}"
        argv = [sys.executable, "-m", "simulator.agent", "--server", self.url, "--token", token, *_agent_args(args)]
        return self._spawn(name, argv, registry=self.agents)

    def stop_agent(self, agent: Proc) -> list[int]:
        """Stops one agent and its model servers; returns the pids that had to be SIGKILLed."""
        return self._stop_procs([agent])

    # --- extra processes: more web processes, model servers, a crash on purpose ----

    def start_process(self, name: str, argv: list[str], *, env: Mapping[str, Any] | None = None) -> Proc:
        """Any child in its own process group, with the stack's environment plus `env`.

        It is one of `procs` (under `name`, or `name-2`, ... if taken), so `stop()`
        ends it with the rest; `stop_process` or `kill_process` end it alone.
        """
        unique, n = name, 2
        while unique in self.procs:
            unique, n = f"{name}-{n}", n + 1
        child_env = self.env
        child_env.update({k: str(v) for k, v in (env or {}).items()})
        return self._spawn(unique, argv, env=child_env)

    def start_web(self, env: Mapping[str, Any] | None = None, *, name: str = "web-extra") -> WebProc:
        """Another web process (its own uvicorn, on a free port) on the stack's database and broker.

        `env` overrides settings for this process alone, e.g. a shorter DRAIN_CEILING_S
        for the pauses it handles, or smaller pools. Waits for its /healthz.
        """
        port = free_port(self.host)
        proc = self.start_process(
            name,
            [
                sys.executable, "-m", "uvicorn", "marketplace.asgi:application",
                "--host", self.host, "--port", str(port), "--workers", "1",
                "--no-access-log", "--log-level", "warning", "--timeout-graceful-shutdown", "3",
            ],
            env=env,
        )
        web = WebProc(proc, f"http://{self.host}:{port}")

        def healthy() -> bool:
            if not proc.alive():
                raise StackError(f"{proc.name} exited with code {proc.popen.returncode}\n{proc.log_tail()}")
            try:
                return httpx.get(f"{web.url}/healthz", timeout=1.0, trust_env=False).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(healthy, self.start_timeout_s, f"{proc.name} to answer /healthz", on_timeout=proc.log_tail)
        except BaseException:
            self.stop_process(proc)
            raise
        return web

    def start_celery_worker(
        self, name: str = "worker-extra", *, concurrency: int | None = None, env: Mapping[str, Any] | None = None
    ) -> Proc:
        """Another Celery worker on the stack's broker (or the stack's own `worker` again after a
        `kill_process`); waits until it has said it is ready."""
        unique, n = name, 2
        while unique in self.procs:
            unique, n = f"{name}-{n}", n + 1
        log_path = self.log_dir / f"{unique}.log"
        # A restart appends to the same log: only a " ready." written after this point counts.
        offset = log_path.stat().st_size if log_path.exists() else 0
        proc = self.start_process(
            unique,
            [
                sys.executable, "-m", "celery", "-A", "marketplace", "worker",
                "--loglevel", "info", "--concurrency", str(concurrency or self.celery_concurrency),
                "--hostname", f"{unique}-{os.getpid()}-{time.monotonic_ns():x}@%h",
                "--without-gossip", "--without-mingle",
            ],
            env=env,
        )

        def ready() -> bool:
            if not proc.alive():
                raise StackError(f"{proc.name} exited with code {proc.popen.returncode}\n{proc.log_tail()}")
            with open(log_path, "rb") as log:
                log.seek(offset)
                return b" ready." in log.read()

        try:
            wait_until(ready, self.start_timeout_s, f"{proc.name} to be ready", interval=0.1, on_timeout=proc.log_tail)
        except BaseException:
            self.stop_process(proc)
            raise
        return proc

    def stop_process(self, *procs: Proc) -> list[int]:
        """SIGTERM these process groups together, SIGKILL after the timeout; returns the pids that survived."""
        survivors = self._stop_procs(list(procs))
        for proc in procs:
            self._forget(proc)
        return survivors

    def kill_process(self, proc: Proc) -> None:
        """SIGKILL one process group at once (a crash, no graceful shutdown) and wait until it is gone."""
        _signal_group(proc.pid, signal.SIGKILL)
        survivors = _reap(proc)
        self._forget(proc)
        if survivors:
            raise StackError(f"processes of {proc.name} survived SIGKILL: {survivors}")

    def _forget(self, proc: Proc) -> None:
        for key, known in list(self.procs.items()):
            if known is proc:
                del self.procs[key]
        if proc in self.agents:
            self.agents.remove(proc)

    def stop(self) -> None:
        """SIGTERM every process group, SIGKILL what is left after the timeout, verify none survives."""
        procs = [*self.agents, *reversed(list(self.procs.values()))]
        survivors = self._stop_procs(procs)
        self.agents.clear()
        self.procs.clear()
        if self._started and self.drop_database_on_stop:
            self._started = False
            drop_database(self.database_url)
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        if survivors:
            raise StackError(f"processes survived SIGKILL: {survivors}")

    def _stop_procs(self, procs: list[Proc]) -> list[int]:
        # Agents first and all groups at once: one timeout for the lot, not one each.
        for proc in procs:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for proc in procs:
            try:
                proc.popen.wait(max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                pass
        # Children of the leaders (pool processes, model servers) may outlive them.
        while time.monotonic() < deadline and any(group_members(p.pid) for p in procs):
            time.sleep(0.05)
        for proc in procs:
            _signal_group(proc.pid, signal.SIGKILL)
        survivors: list[int] = []
        for proc in procs:
            survivors.extend(_reap(proc))
            if proc in self.agents:
                self.agents.remove(proc)
        return survivors

    # --- helpers for drivers --------------------------------------------------

    def migrate(self) -> None:
        self.manage("migrate", "--noinput", timeout=120)

    def manage(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`manage.py <args>` in a child with the stack's environment; raises with its output on failure."""
        result = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise StackError(f"manage.py {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def api(
        self, token: str | None = None, *, scheme: str = "Token", timeout: float = 10.0, url: str | None = None
    ) -> httpx.Client:
        """An HTTP client on the stack's URL (or `url`, another web process's); `token` as a
        user's `Token` or, with scheme="Bearer", an agent's."""
        headers = {"Authorization": f"{scheme} {token}"} if token else {}
        return httpx.Client(base_url=url or self.url, headers=headers, timeout=timeout, trust_env=False)

    def db(self) -> psycopg.Connection[Any]:
        """A psycopg connection to the stack's database (autocommit), for set-up and assertions."""
        return psycopg.connect(libpq_url(self.database_url), autocommit=True)

    def diagnostics(self, lines: int = 30) -> str:
        """The tail of every process's log, for a failure message."""
        parts = []
        for proc in [*self.procs.values(), *self.agents]:
            state = "running" if proc.alive() else f"exited {proc.popen.returncode}"
            parts.append(f"--- {proc.name} ({state}) {proc.log_path}\n{proc.log_tail(lines)}")
        return "\n".join(parts)
