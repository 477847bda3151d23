"""`python -m simulator.agent` as a real process against the fake plane on a
real port: the daemon loop, and that no worker outlives the agent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest


@pytest.fixture
def run_agent(plane_url: str, sim: SimpleNamespace) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def run(*args: str, token: str = sim.token) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "simulator.agent", "--server", plane_url, "--stop-grace-s", "2", *args]
        proc = subprocess.Popen(argv, cwd=sim.root, env={**sim.env(), "AGENT_TOKEN": token})
        started.append(proc)
        return proc

    yield run
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def serving_worker(plane: Any, sim: SimpleNamespace) -> tuple[str, int]:
    """Waits for the agent's worker to register; returns its endpoint and pid."""
    [registration] = sim.wait(lambda: plane.bodies("/agent/workers"), 15, "worker registration")
    endpoint = registration["endpoint"]
    pid = httpx.get(f"{endpoint}/sim/stats").json()["pid"]
    return endpoint, pid


def test_agent_runs_heartbeats_and_sigterm_leaves_no_child(run_agent: Any, plane: Any, sim: SimpleNamespace) -> None:
    plane.interval = 0.2
    start = plane.send("start_worker", {"worker_id": 21, "model": "m1"})
    agent = run_agent("--gpu-model", "H100", "--cloud", "aws", "--instance-id", "i-42")
    endpoint, pid = serving_worker(plane, sim)
    [hello] = plane.bodies("/hello")
    assert hello["hardware"]["gpu_model"] == "H100"
    assert hello["cloud"]["provider"] == "aws" and hello["cloud"]["instance_id"] == "i-42"
    sim.wait(lambda: plane.acks(start["id"]), 10, "start_worker ack")
    ready = {"workers": [{"id": 21, "status": "ready", "in_flight": 0}], "rentals": []}
    sim.wait(lambda: ready in plane.bodies("/heartbeat"), 5, "a heartbeat reporting the worker ready")
    # Delivered in every reply until acked, executed once.
    assert len(plane.acks(start["id"])) == 1
    assert len(plane.bodies("/agent/workers")) == 1

    agent.send_signal(signal.SIGTERM)
    assert agent.wait(10) == 0
    assert not sim.pid_alive(pid)
    assert not sim.answers(f"{endpoint}/healthz")


def test_worker_dies_with_a_sigkilled_agent(run_agent: Any, plane: Any, sim: SimpleNamespace) -> None:
    plane.send("start_worker", {"worker_id": 22, "model": "m1"})
    agent = run_agent()
    _, pid = serving_worker(plane, sim)
    agent.kill()
    agent.wait(5)
    try:
        sim.wait(lambda: not sim.pid_alive(pid), 5, "orphaned worker to die")
    finally:
        if sim.pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_bad_token_exits_2(run_agent: Any, plane: Any) -> None:
    assert run_agent(token="wrong").wait(10) == 2
