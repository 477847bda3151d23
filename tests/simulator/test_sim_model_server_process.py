"""`python -m simulator.model_server` as a real process: streaming over the
wire, the die-after abort as the client sees it, and signal handling."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}


def read_stream(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> list[tuple[float, Any]]:
    """(arrival time, event) per SSE event, read line by line as it arrives."""
    events = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=10) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append((time.monotonic(), data if data == "[DONE]" else json.loads(data)))
    return events


def test_stream_arrives_token_by_token(start_model_server: Any) -> None:
    _, url = start_model_server("--tokens-per-s", "20")
    events = read_stream(url, {**CHAT, "max_tokens": 6, "stream": True})
    assert events[-1][1] == "[DONE]"
    contents = [e for _, e in events[1:-2]]
    assert [c["choices"][0]["delta"]["content"] for c in contents] == ["tok0", " tok1", " tok2", " tok3", " tok4", " tok5"]
    first_token_at, done_at = events[1][0], events[-1][0]
    # Six tokens at 20/s span ~0.25 s between the first and the last; a
    # buffered response would deliver them all at once.
    assert done_at - first_token_at > 0.15


def test_die_after_cuts_the_connection_mid_stream(start_model_server: Any) -> None:
    _, url = start_model_server("--tokens-per-s", "0")
    events: list[Any] = []
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream(
            "POST",
            f"{url}/v1/chat/completions",
            json={**CHAT, "max_tokens": 10, "stream": True},
            headers={"x-sim-die-after": "3"},
            timeout=10,
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: ") :])
    assert "[DONE]" not in events
    contents = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[1:]]
    assert contents == ["tok0", " tok1", " tok2"]

    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers={"x-sim-die-after": "1"}, timeout=10)

    # The server itself lives on and counted the aborts.
    stats = httpx.get(f"{url}/sim/stats").json()
    assert (stats["in_flight"], stats["served"], stats["aborted"]) == (0, 0, 2)
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT).status_code == 200


def test_sigterm_stops_it_gracefully(start_model_server: Any) -> None:
    proc, _ = start_model_server()
    proc.send_signal(signal.SIGTERM)
    # uvicorn re-raises the signal after its graceful shutdown.
    assert proc.wait(5) in (0, -signal.SIGTERM)


def test_ignore_sigterm_survives_sigterm_and_dies_to_sigkill(start_model_server: Any, sim: SimpleNamespace) -> None:
    proc, url = start_model_server("--ignore-sigterm")
    proc.send_signal(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.5)
    assert sim.answers(f"{url}/healthz")
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(5) == -signal.SIGKILL
