"""The reference node agent: speaks the agent API (API.md, "Agent") and runs
model-server workers as local child processes.

The platform is the source of truth: the agent reports what it sees, does
what the commands say, and acknowledges each command. Commands are delivered
until acknowledged, so every command id is executed at most once and merely
acknowledged again when it comes back.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from simulator import procs

log = logging.getLogger("simulator.agent")

DEFAULT_WORKER_CMD = "{python} -m simulator.model_server --host {host} --port {port} --model {model}"
# Platform statuses after which the local process has no reason to live.
GONE_STATUSES = frozenset({"stopped", "lost", "unknown"})
_BACKGROUND_KINDS = frozenset({"start_worker", "stop_worker", "run_render"})
_RUNNING = object()  # marker: command accepted, not finished yet
_MAX_REMEMBERED_COMMANDS = 10_000
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)

Result = dict[str, Any]


class AgentAuthError(Exception):
    """The platform rejected the agent token; retrying cannot help."""


@dataclass
class LocalWorker:
    id: Any
    model: str
    endpoint: str
    proc: subprocess.Popen[bytes]
    ready: bool = False
    platform_status: str | None = None


def reply_interval(reply: dict[str, Any]) -> float | None:
    """The heartbeat interval a hello or heartbeat reply asks for; None when it names none (keep the current one)."""
    try:
        interval = float(reply.get("heartbeat_interval_s") or 0)
    except (TypeError, ValueError):
        return None
    return interval if interval > 0 else None


def count_frames(frames: Any) -> int:
    """Frames as "1-240", "1,5,10-12", an int or a list."""
    if isinstance(frames, bool):
        raise ValueError("frames must be a range like '1-240'")
    if isinstance(frames, int):
        return max(frames, 0)
    if isinstance(frames, list):
        return len(frames)
    total = 0
    for part in str(frames).split(","):
        first, _, last = part.strip().partition("-")
        start = int(first)  # ValueError for garbage: the command is acked as failed
        total += int(last) - start + 1 if last else 1
    return max(total, 0)


class Agent:
    """One node's agent. `run()` is the daemon; tests call `hello()`,
    `heartbeat_once()` and `handle()` directly."""

    def __init__(
        self,
        server: str,
        token: str,
        *,
        hardware: dict[str, Any] | None = None,
        cloud: dict[str, Any] | None = None,
        worker_cmd: str = DEFAULT_WORKER_CMD,
        worker_host: str = "127.0.0.1",
        stop_grace_s: float = 5.0,
        start_timeout_s: float = 30.0,
        max_slots: int = 8,
        client: httpx.Client | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self.hardware = hardware or {"gpu_model": "A100", "gpu_count": 1, "vram_gb": 80}
        self.cloud = cloud or {}
        self.worker_argv = shlex.split(worker_cmd)
        self.worker_host = worker_host
        self.stop_grace_s = stop_grace_s
        self.start_timeout_s = start_timeout_s
        self.max_slots = max_slots
        self.node_id: Any = None
        self.heartbeat_interval_s = 5.0
        self._headers = {"Authorization": f"Bearer {token}"}
        self._owns_client = client is None
        self._client = client or httpx.Client(timeout=httpx.Timeout(5.0))
        # Worker probes go to local processes, never through an injected
        # (possibly mocked) control-plane client.
        self._local = httpx.Client(timeout=httpx.Timeout(1.0), trust_env=False)
        self._lock = threading.RLock()
        self._closing = threading.Event()
        self._workers: dict[str, LocalWorker] = {}
        self._rentals: dict[str, dict[str, Any]] = {}
        self._commands: OrderedDict[str, Any] = OrderedDict()
        self._pending_acks: dict[str, tuple[Any, Result]] = {}
        self._children: set[subprocess.Popen[bytes]] = set()
        self._threads: set[threading.Thread] = set()
        # Children are forked from this one long-lived thread: PDEATHSIG is
        # tied to the forking thread, and start threads are short-lived.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-spawner")
        self._handlers: dict[str, Callable[[dict[str, Any]], Result]] = {
            "start_worker": self._start_worker,
            "stop_worker": self._stop_worker,
            "start_rental": self._start_rental,
            "stop_rental": self._stop_rental,
            "run_render": self._run_render,
        }

    # --- control-plane calls -------------------------------------------

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return self._client.post(f"{self.server}/api/v1/agent/{path}", json=body, headers=self._headers)

    def hello(self) -> dict[str, Any]:
        """Announces the node; raises on failure (AgentAuthError for a bad token)."""
        response = self._post("hello", {"hardware": self.hardware, "cloud": self.cloud})
        if response.status_code in (401, 403):
            raise AgentAuthError(f"hello rejected with {response.status_code}: {response.text[:200]}")
        response.raise_for_status()
        reply = response.json()
        self.node_id = reply.get("node_id")
        self._set_interval(reply)
        commands = reply.get("commands") or []
        log.info("hello: node %s, heartbeat every %ss, %d command(s)", self.node_id, self.heartbeat_interval_s, len(commands))
        for command in commands:
            self.handle(command)
        return reply

    def heartbeat_once(self) -> dict[str, Any] | None:
        """One heartbeat; returns the reply, or None when it failed (logged)."""
        self._flush_acks()
        workers, dead = self._worker_report()
        with self._lock:
            rentals = [dict(r) for r in self._rentals.values()]
        try:
            response = self._post("heartbeat", {"workers": workers, "rentals": rentals})
            response.raise_for_status()
            reply = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("heartbeat failed: %s", exc)
            return None
        with self._lock:
            # A dead worker is reported once as stopped; the platform owns it from there.
            for key in dead:
                self._workers.pop(key, None)
        commands = reply.get("commands") or []
        # A stop_worker in this reply carries the platform's grace and gets the
        # interrupted count in its ack: let it stop those workers, not the status.
        stopping = {
            str((c.get("payload") or {}).get("worker_id")) for c in commands if c.get("kind") == "stop_worker"
        }
        self._apply_worker_statuses([w for w in reply.get("workers") or [] if str(w.get("id")) not in stopping])
        self._set_interval(reply)
        for command in commands:
            self.handle(command)
        return reply

    def _set_interval(self, reply: dict[str, Any]) -> None:
        interval = reply_interval(reply)
        if interval is not None:
            self.heartbeat_interval_s = interval

    def _worker_report(self) -> tuple[list[dict[str, Any]], list[str]]:
        with self._lock:
            workers = list(self._workers.items())
        report, dead = [], []
        for key, worker in workers:
            code = worker.proc.poll()
            if code is not None:
                report.append({"id": worker.id, "status": "stopped", "in_flight": 0, "exit_code": code})
                dead.append(key)
            elif worker.ready:
                report.append({"id": worker.id, "status": "ready", "in_flight": self._in_flight(worker)})
            else:
                report.append({"id": worker.id, "status": "starting", "in_flight": 0})
        return report, dead

    def _apply_worker_statuses(self, statuses: list[dict[str, Any]]) -> None:
        for entry in statuses:
            key, status = str(entry.get("id")), entry.get("status")
            with self._lock:
                worker = self._workers.get(key)
                if worker is None:
                    continue
                worker.platform_status = status
                if status not in GONE_STATUSES:
                    continue
                del self._workers[key]
            log.info("worker %s is %s on the platform: stopping its process", worker.id, status)
            self._background(f"kill-{key}", self._stop_process, worker, self.stop_grace_s, status)

    # --- commands ------------------------------------------------------

    def handle(self, command: dict[str, Any]) -> None:
        """Executes a command once; a command seen before is only re-acked."""
        cid, kind = command.get("id"), command.get("kind")
        if cid is None:
            log.warning("command without id ignored: %r", command)
            return
        key = str(cid)
        with self._lock:
            state = self._commands.get(key)
            if state is None:
                self._commands[key] = _RUNNING
        if state is _RUNNING:
            return
        if state is not None:
            log.info("command %s (%s) already handled: acking again", cid, kind)
            self._ack(cid, state)
            return
        payload = command.get("payload") or {}
        log.info("command %s received: %s %s", cid, kind, payload)
        handler = self._handlers.get(str(kind))
        if handler is None:
            self._finish(cid, {"ok": False, "detail": "unknown command kind"})
        elif kind in _BACKGROUND_KINDS:
            self._background(f"cmd-{cid}", self._execute, cid, handler, payload)
        else:
            self._execute(cid, handler, payload)

    def _execute(self, cid: Any, handler: Callable[[dict[str, Any]], Result], payload: dict[str, Any]) -> None:
        try:
            result = handler(payload)
        except Exception as exc:
            log.exception("command %s failed", cid)
            result = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
        self._finish(cid, result)

    def _finish(self, cid: Any, result: Result) -> None:
        with self._lock:
            self._commands[str(cid)] = result
            self._commands.move_to_end(str(cid))
            while len(self._commands) > _MAX_REMEMBERED_COMMANDS:
                self._commands.popitem(last=False)
        log.info("command %s done: %s", cid, result)
        self._ack(cid, result)

    def _ack(self, cid: Any, result: Result) -> bool:
        try:
            response = self._post(f"commands/{cid}/ack", result)
            # A 4xx will not get better by retrying (but a 429 will); the platform
            # redelivers the command if it still wants an answer.
            retry = response.status_code >= 500 or response.status_code == 429
            if response.status_code >= 400:
                log.warning("ack of command %s answered %s", cid, response.status_code)
        except httpx.HTTPError as exc:
            log.warning("ack of command %s failed: %s", cid, exc)
            retry = True
        with self._lock:
            if retry:
                self._pending_acks[str(cid)] = (cid, result)
            else:
                self._pending_acks.pop(str(cid), None)
        return not retry

    def _flush_acks(self) -> None:
        with self._lock:
            pending = list(self._pending_acks.values())
        for cid, result in pending:
            self._ack(cid, result)

    # --- command handlers (return the ack body) --------------------------

    def _start_worker(self, payload: dict[str, Any]) -> Result:
        worker_id, model = payload["worker_id"], payload["model"]
        with self._lock:
            if str(worker_id) in self._workers:
                return {"ok": True, "detail": f"worker {worker_id} already running"}
        port = procs.free_port(self.worker_host)
        proc = self._spawn(model, port)
        worker = LocalWorker(worker_id, model, f"http://{self.worker_host}:{port}", proc)
        with self._lock:
            self._workers[str(worker_id)] = worker
        log.info("worker %s starting: model %s at %s (pid %s)", worker_id, model, worker.endpoint, proc.pid)
        failure = self._wait_healthy(worker)
        if failure is None:
            worker.ready = True
            failure = self._register(worker)
        if failure is not None:
            self._forget(worker)
            procs.stop(proc, 1.0)
            log.warning("worker %s failed to start: %s", worker_id, failure)
            return {"ok": False, "detail": failure}
        return {"ok": True, "detail": f"worker {worker.id} {worker.platform_status} at {worker.endpoint}"}

    def _spawn(self, model: str, port: int) -> subprocess.Popen[bytes]:
        values = {"python": sys.executable, "host": self.worker_host, "port": port, "model": model}
        argv = [arg.format(**values) for arg in self.worker_argv]
        env = dict(os.environ)
        # `-m simulator.model_server` must resolve wherever the agent was started.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)

        def locked_spawn() -> subprocess.Popen[bytes]:
            # Under the lock so shutdown cannot miss a child forked meanwhile.
            with self._lock:
                if self._closing.is_set():
                    raise RuntimeError("agent is shutting down")
                proc = procs.spawn(argv, env)
                self._children.add(proc)
                return proc

        return self._spawner.submit(locked_spawn).result()

    def _wait_healthy(self, worker: LocalWorker) -> str | None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            code = worker.proc.poll()
            if code is not None:
                return f"worker process exited with code {code} before answering /healthz"
            try:
                if self._local.get(f"{worker.endpoint}/healthz").status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            if self._closing.wait(0.1):
                return "agent is shutting down"
        return f"worker did not answer /healthz within {self.start_timeout_s:g} s"

    def _register(self, worker: LocalWorker) -> str | None:
        body = {"model": worker.model, "endpoint": worker.endpoint, "max_slots": self.max_slots, "worker_id": worker.id}
        deadline, delay = time.monotonic() + self.start_timeout_s, 0.2
        while True:
            try:
                response = self._post("workers", body)
                if response.status_code < 400:
                    reply = response.json()
                    break
                if response.status_code < 500 and response.status_code != 429:  # a rate limit passes: retry
                    return f"registration rejected with {response.status_code}: {response.text[:200]}"
                error = f"registration answered {response.status_code}"
            except (httpx.HTTPError, ValueError) as exc:
                error = f"registration failed: {exc}"
            if time.monotonic() + delay > deadline or self._closing.wait(delay):
                return error
            delay = min(delay * 2, 2.0)
        worker.platform_status = reply.get("status")
        new_id = reply.get("id", worker.id)
        with self._lock:
            if str(new_id) != str(worker.id) and self._workers.get(str(worker.id)) is worker:
                self._workers[str(new_id)] = self._workers.pop(str(worker.id))
            worker.id = new_id
        # A `draining` worker is kept: the platform drains it and sends stop_worker.
        log.info("worker %s registered: %s at %s", worker.id, worker.platform_status, worker.endpoint)
        return None

    def _stop_worker(self, payload: dict[str, Any]) -> Result:
        worker_id = payload["worker_id"]
        grace = float(payload["grace_s"] if payload.get("grace_s") is not None else self.stop_grace_s)
        with self._lock:
            worker = self._workers.pop(str(worker_id), None)
        if worker is None:
            log.info("stop_worker %s: no such local worker (already gone)", worker_id)
            return {"ok": True, "detail": "no such worker (already gone)", "interrupted": 0}
        interrupted = self._in_flight(worker)
        code = self._stop_process(worker, grace, payload.get("reason"))
        return {"ok": True, "detail": f"stopped, exit code {code}", "interrupted": interrupted}

    def _stop_process(self, worker: LocalWorker, grace_s: float, reason: Any) -> int:
        code = procs.stop(worker.proc, grace_s)
        with self._lock:
            self._children.discard(worker.proc)
        log.info("worker %s stopped (reason %s, exit code %s)", worker.id, reason, code)
        return code

    def _forget(self, worker: LocalWorker) -> None:
        with self._lock:
            if self._workers.get(str(worker.id)) is worker:
                del self._workers[str(worker.id)]

    def _start_rental(self, payload: dict[str, Any]) -> Result:
        rental_id = payload["rental_id"]
        with self._lock:
            self._rentals[str(rental_id)] = {"id": rental_id, "status": "active"}
        log.info("rental %s active", rental_id)
        return {"ok": True}

    def _stop_rental(self, payload: dict[str, Any]) -> Result:
        rental_id = payload["rental_id"]
        with self._lock:
            self._rentals[str(rental_id)] = {"id": rental_id, "status": "stopped", "stopped_at": payload.get("at")}
        log.info("rental %s stopped (at %s)", rental_id, payload.get("at"))
        return {"ok": True}

    def _run_render(self, payload: dict[str, Any]) -> Result:
        frames = count_frames(payload.get("frames", 0))
        self._closing.wait(min(frames * 0.005, 2.0))
        log.info("render job %s: rendered %d frames", payload.get("job_id"), frames)
        return {"ok": True, "detail": f"rendered {frames} frames"}

    # --- local helpers ---------------------------------------------------

    def _in_flight(self, worker: LocalWorker) -> int:
        try:
            return int(self._local.get(f"{worker.endpoint}/sim/stats").json().get("in_flight", 0))
        except (httpx.HTTPError, ValueError, TypeError, AttributeError):
            return 0

    def _background(self, name: str, fn: Callable[..., Any], *args: Any) -> None:
        def run() -> None:
            try:
                fn(*args)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Waits for background command threads; True when all are done."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                threads = list(self._threads)
            if not threads:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            threads[0].join(remaining)

    def worker_pids(self) -> dict[Any, int]:
        with self._lock:
            return {w.id: w.proc.pid for w in self._workers.values()}

    # --- lifecycle -----------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Hello (retried until it works), then heartbeats until `stop` is set."""
        delay = 0.5
        while not stop.is_set():
            try:
                self.hello()
                break
            except AgentAuthError:
                raise
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("hello failed: %s; retrying in %.1f s", exc, delay)
                stop.wait(delay)
                delay = min(delay * 2, 10.0)
        failures, wait = 0, self.heartbeat_interval_s
        while not stop.wait(wait):
            if self.heartbeat_once() is None:
                # Retry soon after a failure, backing off up to a normal beat.
                failures += 1
                wait = min(0.5 * 2 ** min(failures - 1, 10), self.heartbeat_interval_s)
            else:
                failures, wait = 0, self.heartbeat_interval_s

    def shutdown(self) -> None:
        """Stops every worker process (SIGTERM, SIGKILL after the grace)."""
        with self._lock:
            if self._closing.is_set():
                return
            self._closing.set()
            children = [p for p in self._children if p.poll() is None]
            names = {w.proc.pid: w.id for w in self._workers.values()}
            self._workers.clear()
        if children:
            log.info("shutting down: stopping %d worker process(es)", len(children))
        for proc, code in zip(children, procs.stop_all(children, self.stop_grace_s)):
            log.info("worker %s stopped (agent shutdown, exit code %s)", names.get(proc.pid, f"pid {proc.pid}"), code)
        self._spawner.shutdown(wait=True)
        self.wait_idle(self.stop_grace_s + 2.0)
        self._local.close()
        if self._owns_client:
            self._client.close()


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m simulator.agent", description="Reference node agent.")
    parser.add_argument("--server", default=os.environ.get("MARKETPLACE_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("AGENT_TOKEN"), help="default: $AGENT_TOKEN")
    parser.add_argument("--gpu-model", default="A100")
    parser.add_argument("--gpu-count", type=int, default=1)
    parser.add_argument("--vram-gb", type=int, default=80)
    parser.add_argument("--cloud", default=None, help="aws, gcp, azure, ...")
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--instance-type", default=None)
    parser.add_argument("--region", default=None)
    parser.add_argument("--zone", default=None)
    parser.add_argument("--worker-cmd", default=DEFAULT_WORKER_CMD, help="placeholders: {python} {host} {port} {model}")
    parser.add_argument("--worker-host", default="127.0.0.1")
    parser.add_argument("--stop-grace-s", type=float, default=5.0)
    parser.add_argument("--start-timeout-s", type=float, default=30.0)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("--token or $AGENT_TOKEN is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr, level=args.log_level.upper(), format="%(asctime)s agent %(levelname)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        log.info("%s received: shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent = Agent(
        args.server,
        args.token,
        hardware={"gpu_model": args.gpu_model, "gpu_count": args.gpu_count, "vram_gb": args.vram_gb},
        cloud={
            "provider": args.cloud,
            "instance_id": args.instance_id,
            "instance_type": args.instance_type,
            "region": args.region,
            "zone": args.zone,
        },
        worker_cmd=args.worker_cmd,
        worker_host=args.worker_host,
        stop_grace_s=args.stop_grace_s,
        start_timeout_s=args.start_timeout_s,
    )
    code = 0
    try:
        agent.run(stop)
    except AgentAuthError as exc:
        log.error("%s", exc)
        code = 2
    finally:
        agent.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
