"""The fake model server in-process (ASGITransport buffers whole responses,
which is fine for checking shapes; wire behaviour is in the _process tests)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from simulator.model_server import SimulatedCrash, create_app

MODEL = "sim-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "say four words"}]}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def app() -> Any:
    return create_app(MODEL, tokens_per_s=0, default_max_tokens=4)


@pytest.fixture
async def client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
        yield client


def sse_events(text: str) -> list[Any]:
    events = []
    for block in text.split("\n\n"):
        if block:
            assert block.startswith("data: "), block
            data = block[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


pytestmark = pytest.mark.anyio


async def test_models_lists_the_served_model(client: httpx.AsyncClient) -> None:
    body = (await client.get("/v1/models")).json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"]) for m in body["data"]] == [(MODEL, "model")]


async def test_health_and_stats(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"ok": True}
    stats = (await client.get("/sim/stats")).json()
    assert (stats["in_flight"], stats["served"]) == (0, 0)


async def test_chat_completion_body_and_usage(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "tok0 tok1 tok2 tok3 tok4"}
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert (await client.get("/sim/stats")).json()["served"] == 1


async def test_default_length_finishes_with_stop(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/chat/completions", json=CHAT)).json()
    assert body["choices"][0]["message"]["content"] == "tok0 tok1 tok2 tok3"
    assert body["choices"][0]["finish_reason"] == "stop"


async def test_text_completion_body(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", json={"model": MODEL, "prompt": "a b c", "max_tokens": 2})
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "tok0 tok1"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


async def test_chat_stream_yields_n_content_chunks_then_done(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3, "stream": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [c["choices"][0]["delta"]["content"] for c in chunks[1:-1]]
    assert content == ["tok0", " tok1", " tok2"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert len({c["id"] for c in chunks}) == 1


async def test_stream_include_usage_adds_a_usage_chunk(client: httpx.AsyncClient) -> None:
    request = {**CHAT, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events((await client.post("/v1/chat/completions", json=request)).text)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 2
    assert all(e["usage"] is None for e in events[:-2])


async def test_text_completion_stream(client: httpx.AsyncClient) -> None:
    request = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": True}
    events = sse_events((await client.post("/v1/completions", json=request)).text)
    assert [e["choices"][0]["text"] for e in events[:-1]] == ["tok0", " tok1", ""]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1] == "[DONE]"


@pytest.mark.parametrize("status", [503, 429, 500])
async def test_sim_status_answers_an_openai_error(client: httpx.AsyncClient, status: int) -> None:
    response = await client.post("/v1/chat/completions", json=CHAT, headers={"x-sim-status": str(status)})
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert ("retry-after" in response.headers) == (status in (429, 503))


async def test_die_after_raises_inside_the_stream(app: Any) -> None:
    # In-process the crash surfaces as the app's exception; over the wire
    # it is a cut connection (see test_sim_model_server_process).
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        with pytest.raises(SimulatedCrash):
            await client.post(
                "/v1/chat/completions", json={**CHAT, "stream": True}, headers={"x-sim-die-after": "2"}
            )
        stats = (await client.get("/sim/stats")).json()
    assert (stats["in_flight"], stats["served"], stats["aborted"]) == (0, 0, 1)


async def test_unknown_model_and_bad_bodies(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json={**CHAT, "model": "other"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    assert (await client.post("/v1/chat/completions", content=b"{nope")).status_code == 400
    assert (await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": -1})).status_code == 400
    assert (await client.post("/v1/completions", json={"model": MODEL})).status_code == 400


async def test_tokens_are_paced_and_counted_in_flight() -> None:
    app = create_app(MODEL, tokens_per_s=100, prompt_delay_ms=50)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        seen: list[int] = []

        async def watch() -> None:
            for _ in range(20):
                seen.append((await client.get("/sim/stats")).json()["in_flight"])
                await anyio.sleep(0.01)

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            response = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 10})
        elapsed = time.monotonic() - started
    assert response.json()["usage"]["completion_tokens"] == 10
    assert elapsed >= 0.14  # 50 ms prompt + 10 tokens at 100/s
    assert 1 in seen
