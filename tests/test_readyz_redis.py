"""/readyz against a real Redis of its own: 503 naming Redis while it is stopped, 200 when back."""

import shutil
import subprocess
import time

import pytest

from simulator.procs import free_port

pytestmark = pytest.mark.django_db


def start_redis(port: int, workdir) -> subprocess.Popen:
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).stdout.strip() != b"PONG":
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("redis-server did not start")
        time.sleep(0.05)
    return proc


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_readyz_names_redis_while_it_is_stopped_and_recovers(client, settings, monkeypatch, tmp_path):
    from marketplace.celery import app

    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    monkeypatch.setattr(app.conf, "broker_url", url)
    settings.CELERY_BROKER_URL = url
    redis = start_redis(port, tmp_path)
    try:
        assert client.get("/readyz").status_code == 200
        redis.terminate()
        redis.wait(timeout=10)
        down = client.get("/readyz")
        assert down.status_code == 503
        assert down.json()["down"] == [down.json()["down"][0]] and down.json()["down"][0].startswith("broker (redis)")
        redis = start_redis(port, tmp_path)
        assert client.get("/readyz").json() == {"ok": True, "down": []}
    finally:
        redis.kill()
        redis.wait()
