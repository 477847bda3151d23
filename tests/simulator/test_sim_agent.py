"""The agent driven step by step against the in-process fake plane; its
workers are real model-server processes."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from simulator.agent import DEFAULT_WORKER_CMD, count_frames

SLOW_WORKER = DEFAULT_WORKER_CMD + " --tokens-per-s 20 --default-max-tokens 200"


def started_worker(agent: Any, plane: Any, sim: SimpleNamespace, worker_id: int, model: str = "m1") -> dict[str, Any]:
    """Sends start_worker and waits for its ack; returns the registration body."""
    command = plane.send("start_worker", {"worker_id": worker_id, "model": model})
    agent.heartbeat_once()
    sim.wait(lambda: plane.acks(command["id"]), 15, "start_worker ack")
    assert plane.acks(command["id"]) == [{"ok": True, "detail": plane.acks(command["id"])[0]["detail"]}]
    return next(b for b in plane.bodies("/agent/workers") if b["worker_id"] == worker_id)


def test_hello_announces_hardware_and_cloud_with_the_token(make_agent: Any, plane: Any) -> None:
    cloud = {"provider": "aws", "instance_id": "i-1", "instance_type": "g5.xlarge", "region": "r", "zone": "z"}
    agent = make_agent(hardware={"gpu_model": "L4", "gpu_count": 2, "vram_gb": 24}, cloud=cloud)
    plane.interval = 0.5
    reply = agent.hello()
    assert reply["node_id"] == 1 and agent.node_id == 1
    assert agent.heartbeat_interval_s == 0.5
    path, body, auth = plane.calls[0]
    assert path == "/api/v1/agent/hello"
    assert body == {"hardware": {"gpu_model": "L4", "gpu_count": 2, "vram_gb": 24}, "cloud": cloud}
    assert auth == "Bearer agent-secret"


def test_worker_lifecycle_start_register_report_stop(make_agent: Any, plane: Any, sim: SimpleNamespace) -> None:
    agent = make_agent()
    start = plane.send("start_worker", {"worker_id": 7, "model": "m1"})
    agent.hello()  # the start_worker comes with the hello reply
    # Redelivered while still starting: not started a second time.
    agent.heartbeat_once()
    sim.wait(lambda: plane.acks(start["id"]), 15, "start_worker ack")
    assert plane.acks(start["id"])[0]["ok"] is True

    [registration] = plane.bodies("/agent/workers")
    endpoint = registration.pop("endpoint")
    assert registration == {"model": "m1", "max_slots": 8, "worker_id": 7}
    assert endpoint.startswith("http://127.0.0.1:")
    assert sim.answers(f"{endpoint}/healthz")
    assert httpx.get(f"{endpoint}/v1/models").json()["data"][0]["id"] == "m1"
    pid = agent.worker_pids()[7]

    agent.heartbeat_once()
    assert plane.bodies("/heartbeat")[-1] == {"workers": [{"id": 7, "status": "ready", "in_flight": 0}], "rentals": []}

    stop = plane.send("stop_worker", {"worker_id": 7, "reason": "drained"})
    agent.heartbeat_once()
    sim.wait(lambda: plane.acks(stop["id"]), 10, "stop_worker ack")
    assert plane.acks(stop["id"]) == [{"ok": True, "detail": plane.acks(stop["id"])[0]["detail"], "interrupted": 0}]
    assert not sim.pid_alive(pid)
    assert not sim.answers(f"{endpoint}/healthz")
    agent.heartbeat_once()
    assert plane.bodies("/heartbeat")[-1]["workers"] == []
    # One start, one registration, one ack per command.
    assert len(plane.bodies("/agent/workers")) == 1
    assert len(plane.acks(start["id"])) == 1


def test_repeated_command_is_acked_again_not_executed_again(make_agent: Any, plane: Any, sim: SimpleNamespace) -> None:
    agent = make_agent()
    started_worker(agent, plane, sim, worker_id=3)
    pids = agent.worker_pids()

    plane.send("start_worker", {"worker_id": 3, "model": "m1"}, cid=1)  # same command id again
    agent.heartbeat_once()
    agent.wait_idle()
    assert len(plane.acks(1)) == 2
    assert plane.acks(1)[0] == plane.acks(1)[1]
    assert len(plane.bodies("/agent/workers")) == 1
    assert agent.worker_pids() == pids


def test_platform_status_stopped_kills_the_local_worker(make_agent: Any, plane: Any, sim: SimpleNamespace) -> None:
    agent = make_agent()
    endpoint = started_worker(agent, plane, sim, worker_id=8)["endpoint"]
    pid = agent.worker_pids()[8]
    plane.status_override["8"] = "stopped"
    agent.heartbeat_once()
    sim.wait(lambda: not sim.pid_alive(pid), 5, "worker process to die")
    assert agent.worker_pids() == {}
    assert not sim.answers(f"{endpoint}/healthz")


def test_registration_answered_draining_keeps_the_process(make_agent: Any, plane: Any, sim: SimpleNamespace) -> None:
    agent = make_agent()
    plane.registration_status = "draining"
    endpoint = started_worker(agent, plane, sim, worker_id=9)["endpoint"]
    assert sim.answers(f"{endpoint}/healthz")
    assert 9 in agent.worker_pids()


def test_stop_worker_reports_in_flight_and_kills_after_grace(make_agent: Any, plane: Any, sim: SimpleNamespace) -> None:
    agent = make_agent(worker_cmd=SLOW_WORKER)
    endpoint = started_worker(agent, plane, sim, worker_id=4)["endpoint"]
    outcome: dict[str, Any] = {}

    def stream() -> None:
        body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        try:
            with httpx.stream("POST", f"{endpoint}/v1/chat/completions", json=body, timeout=10) as response:
                outcome["text"] = "".join(response.iter_text())
        except httpx.HTTPError as exc:
            outcome["error"] = exc

    reader = threading.Thread(target=stream)
    reader.start()
    sim.wait(lambda: httpx.get(f"{endpoint}/sim/stats").json()["in_flight"] == 1, 5, "request in flight")
    agent.heartbeat_once()
    assert plane.bodies("/heartbeat")[-1]["workers"] == [{"id": 4, "status": "ready", "in_flight": 1}]

    # uvicorn's graceful stop would wait ~10 s for this stream: the grace cuts it.
    stop = plane.send("stop_worker", {"worker_id": 4, "reason": "ceiling", "grace_s": 0.3})
    agent.heartbeat_once()
    sim.wait(lambda: plane.acks(stop["id"]), 5, "stop_worker ack")
    assert plane.acks(stop["id"])[0]["interrupted"] == 1
    reader.join(5)
    assert "error" in outcome and "[DONE]" not in outcome.get("text", "")


def test_stop_unknown_worker_acks_ok(make_agent: Any, plane: Any) -> None:
    agent = make_agent()
    agent.handle({"id": 50, "kind": "stop_worker", "payload": {"worker_id": 999, "reason": "drained"}})
    agent.wait_idle()
    assert plane.acks(50)[0]["ok"] is True


@pytest.mark.parametrize(
    "worker_cmd, detail",
    [
        ('{python} -c "import sys; sys.exit(3)"', "exited with code 3"),
        ('{python} -c "import time; time.sleep(30)"', "did not answer /healthz within 0.5 s"),
    ],
)
def test_worker_that_never_comes_up_is_acked_as_failed(
    make_agent: Any, plane: Any, sim: SimpleNamespace, worker_cmd: str, detail: str
) -> None:
    agent = make_agent(worker_cmd=worker_cmd, start_timeout_s=0.5)
    agent.handle({"id": 60, "kind": "start_worker", "payload": {"worker_id": 1, "model": "m1"}})
    agent.wait_idle()
    [ack] = plane.acks(60)
    assert ack["ok"] is False and detail in ack["detail"]
    assert agent.worker_pids() == {}
    assert plane.bodies("/agent/workers") == []


def test_rentals_are_recorded_and_reported(make_agent: Any, plane: Any) -> None:
    agent = make_agent()
    agent.handle({"id": 1, "kind": "start_rental", "payload": {"rental_id": 11}})
    agent.handle({"id": 2, "kind": "start_rental", "payload": {"rental_id": 12}})
    agent.handle({"id": 3, "kind": "stop_rental", "payload": {"rental_id": 12, "at": "2026-11-30T12:00:00Z"}})
    assert [plane.acks(i) for i in (1, 2, 3)] == [[{"ok": True}]] * 3
    agent.heartbeat_once()
    rentals = plane.bodies("/heartbeat")[-1]["rentals"]
    assert [(r["id"], r["status"]) for r in rentals] == [(11, "active"), (12, "stopped")]


def test_run_render_and_unknown_kind(make_agent: Any, plane: Any) -> None:
    agent = make_agent()
    agent.handle({"id": 1, "kind": "run_render", "payload": {"job_id": 5, "frames": "1-24"}})
    agent.handle({"id": 2, "kind": "make_coffee", "payload": {}})
    agent.wait_idle()
    assert plane.acks(1) == [{"ok": True, "detail": "rendered 24 frames"}]
    assert plane.acks(2) == [{"ok": False, "detail": "unknown command kind"}]


def test_count_frames() -> None:
    assert count_frames("1-240") == 240
    assert count_frames("1,5,10-12") == 5
    assert count_frames(7) == 7
    with pytest.raises(ValueError):
        count_frames("all")


def test_failed_ack_is_retried_on_the_next_heartbeat(make_agent: Any, plane: Any) -> None:
    agent = make_agent()
    plane.fail_acks = 1
    agent.handle({"id": 1, "kind": "start_rental", "payload": {"rental_id": 11}})
    assert plane.acks(1) == [{"ok": True}]  # answered 500
    agent.heartbeat_once()
    assert plane.acks(1) == [{"ok": True}, {"ok": True}]
    agent.heartbeat_once()
    assert len(plane.acks(1)) == 2


def test_network_errors_do_not_crash_the_agent(make_agent: Any, plane: Any) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    agent = make_agent()
    agent._client = httpx.Client(transport=httpx.MockTransport(refuse))
    assert agent.heartbeat_once() is None
    agent.handle({"id": 1, "kind": "start_rental", "payload": {"rental_id": 11}})  # ack fails, kept for later
    agent._client = httpx.Client(transport=plane.mock_transport())
    assert agent.heartbeat_once() is not None
    assert plane.acks(1) == [{"ok": True}]
