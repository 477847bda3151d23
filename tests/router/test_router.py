"""R4 and R6 at the router: admission, passthrough, failover, interruption, the request log."""

import asyncio
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from inference.models import RequestLog
from nodes.drain import finish_drain
from nodes.models import Slot, Worker
from nodes.services import pause_node
from simulator.procs import free_port
from tests.factories import make_node, make_ready_worker
from tests.router.conftest import chat, in_thread, run

pytestmark = pytest.mark.django_db(transaction=True)


def worker_on(url: str, *, spot: bool = False, max_slots: int = 8, owner=None):
    node, _ = make_node(provider=owner, is_spot=spot)
    worker = make_ready_worker(node, max_slots=max_slots)
    Worker.objects.filter(pk=worker.pk).update(endpoint=url)
    return worker


def sse_events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_r4_models_and_auth(router_env, model_servers):
    async def scenario(router, client):
        models = await client.get("/v1/models")
        bad = await client.get("/v1/models", headers={"Authorization": "Bearer sk-wrong"})
        none = await client.post("/v1/chat/completions", json=chat(), headers={"Authorization": ""})
        return models, bad, none

    models, bad, none = run(scenario, router_env)
    assert models.status_code == 200
    assert models.json()["object"] == "list" and models.json()["data"][0]["id"] == "llama-3-8b"
    assert models.headers["x-request-id"]
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
    assert none.status_code == 401


def test_r4_completion_passes_through_and_is_logged(router_env, model_servers):
    worker = worker_on(model_servers())

    async def scenario(router, client):
        response = await client.post("/v1/chat/completions", json=chat(max_tokens=4), headers={"x-request-id": "req-1"})
        await router.settle()
        return response

    response = run(scenario, router_env)
    assert response.status_code == 200
    body = response.json()
    assert body["choices"][0]["message"]["content"] == "tok0 tok1 tok2 tok3"
    assert response.headers["x-request-id"] == "req-1"
    assert response.headers["x-worker-id"] == str(worker.pk)
    row = RequestLog.objects.get(request_id="req-1")
    assert (row.outcome, row.status_code, row.tokens_in, row.tokens_out) == ("completed", 200, 2, 4)
    assert row.worker_id == worker.pk and row.node_id == worker.node_id and row.is_spot is False
    assert row.ttft_ms is not None and row.duration_ms >= row.ttft_ms
    worker.refresh_from_db()
    assert worker.in_flight == 0 and not Slot.objects.exists()


def test_r4_stream_is_passed_through_to_done_and_usage_logged(router_env, model_servers):
    worker_on(model_servers())

    async def scenario(router, client):
        async with client.stream(
            "POST", "/v1/completions",
            json={"model": "llama-3-8b", "prompt": "a b c", "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}},
            headers={"x-request-id": "req-s"},
        ) as response:
            text = (await response.aread()).decode()
        await router.settle()
        return response, text

    response, text = run(scenario, router_env)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    pieces = [json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"]]
    assert "".join(pieces).split() == ["tok0", "tok1", "tok2", "tok3", "tok4"]
    row = RequestLog.objects.get(request_id="req-s")
    assert row.outcome == "completed" and row.stream and row.tokens_out == 5


def test_r4_unknown_model_404_and_no_capacity_503(router_env, model_servers):
    async def scenario(router, client):
        unknown = await client.post("/v1/chat/completions", json=dict(chat(), model="gpt-5"))
        empty = await client.post("/v1/chat/completions", json=chat())
        bad_json = await client.post("/v1/chat/completions", content=b"{nope")
        return unknown, empty, bad_json

    unknown, empty, bad_json = run(scenario, router_env)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert empty.status_code == 503 and empty.headers["retry-after"] == "1"
    assert set(empty.json()["error"]) == {"message", "type", "code"}
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_json"


def test_r4_draining_worker_gets_no_request(router_env, model_servers):
    worker = worker_on(model_servers(), spot=True)
    pause_node(node_id=worker.node_id)

    async def scenario(router, client):
        return await client.post("/v1/chat/completions", json=chat())

    assert run(scenario, router_env).status_code == 503
    assert not RequestLog.objects.filter(worker_id=worker.pk).exists()


def test_r4_least_loaded_worker_first(router_env, model_servers):
    busy = worker_on(model_servers(name="busy"))
    idle = worker_on(model_servers(name="idle"))
    Worker.objects.filter(pk=busy.pk).update(in_flight=3)

    async def scenario(router, client):
        return [(await client.post("/v1/chat/completions", json=chat())).headers["x-worker-id"] for _ in range(3)]

    assert run(scenario, router_env) == [str(idle.pk)] * 3


def test_r4_failover_before_first_byte_is_invisible_to_the_client(router_env, model_servers):
    dead = worker_on(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    alive = worker_on(model_servers())
    Worker.objects.filter(pk=alive.pk).update(in_flight=1)  # so the dead one is tried first

    async def scenario(router, client):
        response = await client.post("/v1/chat/completions", json=chat(), headers={"x-request-id": "fo"})
        await router.settle()
        return response

    response = run(scenario, router_env)
    assert response.status_code == 200 and response.headers["x-worker-id"] == str(alive.pk)
    row = RequestLog.objects.get(request_id="fo")
    assert row.outcome == "failed_over" and row.attempts == 2
    assert Worker.objects.get(pk=dead.pk).in_flight == 0
    assert Worker.objects.get(pk=alive.pk).in_flight == 1  # only the count we set


def test_r4_worker_5xx_fails_over_then_502_when_all_fail(router_env, model_servers):
    worker_on(model_servers(name="a"))
    worker_on(model_servers(name="b"))

    async def scenario(router, client):
        response = await client.post("/v1/chat/completions", json=chat(), headers={"x-sim-status": "503", "x-request-id": "all-fail"})
        await router.settle()
        return response

    response = run(scenario, router_env)
    assert response.status_code == 502 and response.json()["error"]["code"] == "upstream_unavailable"
    row = RequestLog.objects.get(request_id="all-fail")
    assert row.outcome == "rejected" and row.attempts == 2
    assert not Slot.objects.exists()


def test_r6_worker_dying_mid_stream_is_upstream_disconnected(router_env, model_servers):
    worker_on(model_servers())

    async def scenario(router, client):
        async with client.stream("POST", "/v1/chat/completions", json=chat(max_tokens=10, stream=True),
                                 headers={"x-sim-die-after": "3", "x-request-id": "die"}) as response:
            text = (await response.aread()).decode()
        await router.settle()
        return text

    events = sse_events(run(scenario, router_env))
    assert "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert error["type"] == "stream_interrupted" and error["code"] == "upstream_disconnected"
    row = RequestLog.objects.get(request_id="die")
    assert row.outcome == "interrupted" and row.error_code == "upstream_disconnected"
    assert not Slot.objects.exists()


def test_r6_non_streaming_cut_is_502_stream_interrupted(router_env, model_servers):
    worker_on(model_servers())

    async def scenario(router, client):
        return await client.post("/v1/chat/completions", json=chat(max_tokens=10), headers={"x-sim-die-after": "3"})

    response = run(scenario, router_env)
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "stream_interrupted"


def test_r6_stream_running_at_the_drain_deadline_ends_worker_reclaimed(router_env, model_servers):
    worker = worker_on(model_servers(tokens_per_s=20), spot=True)

    async def scenario(router, client):
        async with client.stream("POST", "/v1/chat/completions", json=chat(max_tokens=400, stream=True),
                                 headers={"x-request-id": "cut"}) as response:

            async def deadline_passes() -> None:
                # Wait until the request holds its slot, then pause and let the deadline pass.
                while not await in_thread(lambda: Slot.objects.filter(worker=worker).exists()):
                    await asyncio.sleep(0.02)
                await in_thread(pause_node, node_id=worker.node_id)
                later = timezone.now() + timedelta(seconds=121)
                assert await in_thread(finish_drain, worker.pk, now=later)

            cutter = asyncio.create_task(deadline_passes())
            text = (await response.aread()).decode()
            await cutter
        await router.settle()
        return text

    events = sse_events(run(scenario, router_env))
    assert "[DONE]" not in events
    assert json.loads(events[-1])["error"] == {
        "message": json.loads(events[-1])["error"]["message"], "type": "stream_interrupted", "code": "worker_reclaimed"
    }
    row = RequestLog.objects.get(request_id="cut")
    assert row.outcome == "interrupted" and row.error_code == "worker_reclaimed"
    worker.refresh_from_db()
    assert worker.stop_reason == "ceiling" and worker.requests_cut == 1


def test_r4_last_release_on_draining_worker_finishes_drain(router_env, model_servers):
    worker = worker_on(model_servers(tokens_per_s=100), spot=True)

    async def scenario(router, client):
        async with client.stream("POST", "/v1/chat/completions", json=chat(max_tokens=30, stream=True)) as response:
            while not await in_thread(lambda: Slot.objects.filter(worker=worker).exists()):
                await asyncio.sleep(0.02)
            await in_thread(pause_node, node_id=worker.node_id)
            text = (await response.aread()).decode()
        await router.settle()
        return text

    assert sse_events(run(scenario, router_env))[-1] == "[DONE]"  # it could finish, so it did
    worker.refresh_from_db()
    assert worker.status == "stopped" and worker.stop_reason == "drained"  # at once, not at a tick


def test_r4_client_disconnect_mid_stream_releases_the_slot(router_env, model_servers):
    worker = worker_on(model_servers(tokens_per_s=20))

    async def scenario(router, client):
        async with client.stream("POST", "/v1/chat/completions", json=chat(max_tokens=200, stream=True),
                                 headers={"x-request-id": "gone"}) as response:
            async for _ in response.aiter_bytes():
                break  # the client hangs up after the first bytes
        for _ in range(100):
            await router.settle()
            if not await in_thread(lambda: Slot.objects.exists()):
                break
            await asyncio.sleep(0.05)

    run(scenario, router_env)
    worker.refresh_from_db()
    assert worker.in_flight == 0 and not Slot.objects.exists()
    assert RequestLog.objects.get(request_id="gone").outcome == "client_cancelled"


def test_r4_spot_worker_caps_max_tokens_and_says_so(router_env, model_servers):
    router_env["model"].__class__.objects.filter(pk=router_env["model"].pk).update(typical_tokens_per_s=0.05)  # cap: 6 tokens
    worker_on(model_servers(), spot=True)

    async def scenario(router, client):
        return await client.post("/v1/chat/completions", json=chat(max_tokens=50))

    response = run(scenario, router_env)
    assert response.headers["x-max-tokens-cap"] == "6"
    assert response.json()["usage"]["completion_tokens"] == 6


def test_r4_long_jobs_prefer_on_demand_workers(router_env, model_servers):
    router_env["model"].__class__.objects.filter(pk=router_env["model"].pk).update(typical_tokens_per_s=0.05)
    worker_on(model_servers(name="spot"), spot=True)
    on_demand = worker_on(model_servers(name="od"))
    Worker.objects.filter(pk=on_demand.pk).update(in_flight=5)  # busier, still preferred for long jobs

    async def scenario(router, client):
        long = await client.post("/v1/chat/completions", json=chat(max_tokens=50))
        short = await client.post("/v1/chat/completions", json=chat(max_tokens=2))
        return long, short

    long, short = run(scenario, router_env)
    assert long.headers["x-worker-id"] == str(on_demand.pk) and "x-max-tokens-cap" not in long.headers
    assert short.headers["x-worker-id"] != str(on_demand.pk)


def test_openai_client_chat_and_stream_work_unchanged(router_env, model_servers):
    import openai

    worker_on(model_servers())

    async def scenario(router, client):
        api = openai.AsyncOpenAI(api_key=router_env["key"], base_url=router.url + "/v1", http_client=client)
        reply = await api.chat.completions.create(model="llama-3-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        stream = await api.chat.completions.create(
            model="llama-3-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
        listed = [m.id async for m in api.models.list()]
        return reply, pieces, listed

    reply, pieces, listed = run(scenario, router_env)
    assert reply.choices[0].message.content == "tok0 tok1 tok2"
    assert "".join(pieces).split() == ["tok0", "tok1", "tok2"]
    assert listed == ["llama-3-8b"]
