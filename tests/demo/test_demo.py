"""`make run`'s process set (the Procfile under honcho) on a fresh SQLite database:
the fleet comes up, traffic flows, a Pause drains live, and Ctrl-C leaves nothing behind."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from simulator.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def processes_with(marker: str) -> list[int]:
    """Live processes whose environment carries our marker (children inherit it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes() and b"State:\tZ" not in (entry / "status").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_for(what: str, check, timeout: float, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; log tail:\n{log.read_text()[-3000:]}")


def test_r15_demo_process_set_runs_drains_and_stops_clean(tmp_path):
    marker = f"DEMO_E2E_{uuid.uuid4().hex}"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "PROMETHEUS_MULTIPROC_DIR")}
    env.update({
        "VAR_DIR": str(tmp_path), "MARKETPLACE_PORT": str(port), "WEB_CONCURRENCY": "1", marker: "1",
        "HEARTBEAT_INTERVAL_S": "1", "DRAIN_CEILING_S": "10", "RENTAL_NOTICE_S": "10", "STOP_GRACE_S": "2",
        "DEBUG": "true",
    })
    python = sys.executable
    for command in (["migrate", "--noinput"], ["seed_demo"]):
        subprocess.run([python, "manage.py", *command], cwd=ROOT, env=env, check=True, capture_output=True)
    (tmp_path / "prometheus").mkdir()
    log = tmp_path / "honcho.log"
    with log.open("wb") as out:
        honcho = subprocess.Popen(
            [str(Path(python).with_name("honcho")), "start", "-f", "Procfile"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        api = httpx.Client(base_url=base, timeout=10)
        token = wait_for("the web process", lambda: api.post("/api/v1/auth/token", json={"username": "owner", "password": "owner-pass-123"}).json().get("token"), 60, log)
        api.headers["Authorization"] = f"Token {token}"
        nodes = wait_for(
            "six ready workers",
            lambda: (lambda ns: ns if sum(1 for n in ns for w in n["workers"] if w["status"] == "ready") >= 6 else None)(api.get("/api/v1/nodes").json()),
            90, log,
        )
        wait_for("traffic through the router", lambda: "first streamed token" in log.read_text(), 60, log)
        spot = next(n for n in nodes if n["name"] == "spot-node-1")
        paused = api.post(f"/api/v1/nodes/{spot['id']}/pause")
        assert paused.status_code == 202 and paused.json()["state"] in ("draining", "paused")
        reclaim = wait_for(
            "the drain to finish",
            lambda: next((r for r in api.get(f"/api/v1/nodes/{spot['id']}/reclaims").json() if r["finished_at"]), None),
            30, log,
        )
        assert reclaim["trigger"] == "owner_pause"
        assert all(w["stop_reason"] in ("drained", "ceiling") for w in reclaim["workers"])
        assert api.get(f"/api/v1/nodes/{spot['id']}").json()["state"] == "paused"
    finally:
        os.killpg(honcho.pid, signal.SIGINT)  # what Ctrl-C does
        try:
            honcho.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(honcho.pid, signal.SIGKILL)
            raise
    deadline = time.monotonic() + 10
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(marker) == [], f"left behind: {processes_with(marker)}\n{log.read_text()[-2000:]}"
