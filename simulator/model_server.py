"""A fake OpenAI-compatible model server.

It emits `max_tokens` fake tokens ("tok0 tok1 ...") at a fixed rate after a
fixed prompt delay, so drains, reclaims and the router's streaming proxy can
be exercised with predictable timings. It is also the baseline of the
throughput benchmarks, hence the lean request path.

Fault injection (request headers):
  x-sim-status: 429|500|503   answer that status with an OpenAI error body
  x-sim-die-after: N          drop the connection after N tokens
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

# Below this, sleeping costs more than the pause it buys.
_MIN_INTERVAL_S = 50e-6

_ERROR_KINDS = {
    429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", "internal_error"),
    503: ("server_error", "service_unavailable"),
}


class SimulatedCrash(Exception):
    """Raised mid-response so the server drops the connection (x-sim-die-after)."""


class BadRequest(Exception):
    """A request body the OpenAI API would reject with 400."""


@dataclass
class Stats:
    in_flight: int = 0
    served: int = 0
    aborted: int = 0


@dataclass
class Job:
    chat: bool
    model: str
    max_tokens: int
    explicit_max: bool
    prompt_tokens: int
    stream: bool
    include_usage: bool
    die_after: int | None

    @property
    def finish_reason(self) -> str:
        # The fake model "runs out of things to say" at the default length;
        # an explicit max_tokens is the caller's cap, as with a real model.
        return "length" if self.explicit_max else "stop"


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _sse(obj: Any) -> bytes:
    return f"data: {_json(obj)}\n\n".encode()


def error_response(status: int, message: str, type_: str, code: str | None) -> JSONResponse:
    headers = {"retry-after": "1"} if status in (429, 503) else None
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _word_count(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):  # content parts or a batch of prompts
        return sum(_word_count(v.get("text", "") if isinstance(v, dict) else v) for v in value)
    return 0


def _int_header(request: Request, name: str) -> int | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(f"header {name} must be an integer") from None


def _parse_job(body: Any, request: Request, chat: bool, model: str, default_max: int) -> Job:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    explicit = max_tokens is not None
    if not explicit:
        max_tokens = default_max
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise BadRequest("max_tokens must be a non-negative integer")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        prompt_tokens = sum(_word_count(m.get("content")) + 1 for m in messages if isinstance(m, dict))
    else:
        if "prompt" not in body:
            raise BadRequest("prompt is required")
        prompt_tokens = _word_count(body["prompt"])
    options = body.get("stream_options") or {}
    return Job(
        chat=chat,
        model=body.get("model") or model,
        max_tokens=max_tokens,
        explicit_max=explicit,
        prompt_tokens=max(prompt_tokens, 1),
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        die_after=_int_header(request, "x-sim-die-after"),
    )


def _usage(job: Job, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": job.prompt_tokens + completion_tokens,
    }


class Generator:
    """Produces one job's tokens on schedule and shapes them as OpenAI does."""

    def __init__(self, job: Job, interval_s: float, prompt_delay_s: float) -> None:
        self.job = job
        self.interval_s = interval_s
        self.prompt_delay_s = prompt_delay_s
        self.id = ("chatcmpl-" if job.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.object = "chat.completion" if job.chat else "text_completion"

    async def tokens(self) -> AsyncIterator[str]:
        """Yields the tokens; raises SimulatedCrash where x-sim-die-after says."""
        loop = asyncio.get_running_loop()
        if self.prompt_delay_s > 0:
            await asyncio.sleep(self.prompt_delay_s)
        # An absolute schedule keeps the rate exact however long each send takes.
        start = loop.time()
        die_after = self.job.die_after
        for i in range(self.job.max_tokens):
            if die_after is not None and i >= die_after:
                break
            if self.interval_s:
                delay = start + (i + 1) * self.interval_s - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            yield f"tok{i}" if i == 0 else f" tok{i}"
        if die_after is not None:
            raise SimulatedCrash(f"x-sim-die-after: {die_after}")

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.job.chat else "text_completion",
            "created": self.created,
            "model": self.job.model,
            "choices": [{"index": 0, **choice, "logprobs": None}],
        }
        if self.job.include_usage:
            chunk["usage"] = None
        return chunk

    def _piece(self, text: str, finish: str | None) -> dict[str, Any]:
        if self.job.chat:
            delta = {"content": text} if finish is None else {}
            return self._chunk({"delta": delta, "finish_reason": finish})
        return self._chunk({"text": text, "finish_reason": finish})

    async def sse(self) -> AsyncIterator[bytes]:
        if self.job.chat:
            yield _sse(self._chunk({"delta": {"role": "assistant", "content": ""}, "finish_reason": None}))
        count = 0
        async for token in self.tokens():
            count += 1
            yield _sse(self._piece(token, None))
        yield _sse(self._piece("", self.job.finish_reason))
        if self.job.include_usage:
            usage = self._chunk({})
            usage["choices"] = []
            usage["usage"] = _usage(self.job, count)
            yield _sse(usage)
        yield b"data: [DONE]\n\n"

    def body(self, text: str, count: int) -> dict[str, Any]:
        if self.job.chat:
            choice: dict[str, Any] = {"message": {"role": "assistant", "content": text}}
        else:
            choice = {"text": text}
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.job.model,
            "choices": [{"index": 0, **choice, "logprobs": None, "finish_reason": self.job.finish_reason}],
            "usage": _usage(self.job, count),
        }

    async def full_text(self) -> tuple[str, int]:
        parts = [token async for token in self.tokens()]
        return "".join(parts), len(parts)


def create_app(
    model: str,
    tokens_per_s: float = 50.0,
    prompt_delay_ms: float = 0.0,
    default_max_tokens: int = 16,
) -> Starlette:
    """The model server as an ASGI app; its counters are on `app.state.stats`."""
    interval = 1.0 / tokens_per_s if tokens_per_s > 0 else 0.0
    interval = interval if interval >= _MIN_INTERVAL_S else 0.0
    prompt_delay_s = max(prompt_delay_ms, 0.0) / 1000.0
    stats = Stats()

    async def tracked(gen: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        # Counted inside the generator: a stream that never starts must not
        # leave in_flight raised forever.
        stats.in_flight += 1
        finished = False
        try:
            async for piece in gen:
                yield piece
            finished = True
        finally:
            stats.in_flight -= 1
            if finished:
                stats.served += 1
            else:
                stats.aborted += 1

    async def dying_body(gen: Generator) -> AsyncIterator[bytes]:
        # Only part of a body whose content-length promised more, then the
        # crash: the client sees a truncated response, not a clean one.
        body = _json(gen.body("", 0)).encode()
        yield body[: len(body) // 2]
        await gen.full_text()

    def completion(chat: bool) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                status = _int_header(request, "x-sim-status")
                if status is not None and 400 <= status <= 599:
                    type_, code = _ERROR_KINDS.get(
                        status, ("server_error" if status >= 500 else "invalid_request_error", "simulated")
                    )
                    return error_response(status, f"simulated {status}", type_, code)
                try:
                    body = json.loads(await request.body())
                except ValueError:
                    raise BadRequest("request body is not valid JSON") from None
                job = _parse_job(body, request, chat, model, default_max_tokens)
            except BadRequest as exc:
                return error_response(400, str(exc), "invalid_request_error", None)
            if job.model != model:
                msg = f"The model `{job.model}` does not exist."
                return error_response(404, msg, "invalid_request_error", "model_not_found")
            gen = Generator(job, interval, prompt_delay_s)
            if job.stream:
                headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
                return StreamingResponse(tracked(gen.sse()), media_type="text/event-stream", headers=headers)
            if job.die_after is not None:
                length = str(len(_json(gen.body("", 0))) * 2)
                return StreamingResponse(
                    tracked(dying_body(gen)), media_type="application/json", headers={"content-length": length}
                )
            stats.in_flight += 1
            try:
                text, count = await gen.full_text()
            except BaseException:
                stats.aborted += 1
                raise
            finally:
                stats.in_flight -= 1
            stats.served += 1
            return JSONResponse(gen.body(text, count))

        return endpoint

    async def models(request: Request) -> Response:
        entry = {"id": model, "object": "model", "created": started, "owned_by": "simulator"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def sim_stats(request: Request) -> Response:
        return JSONResponse(
            {"in_flight": stats.in_flight, "served": stats.served, "aborted": stats.aborted, "pid": os.getpid()}
        )

    started = int(time.time())
    app = Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/chat/completions", completion(chat=True), methods=["POST"]),
            Route("/v1/completions", completion(chat=False), methods=["POST"]),
            Route("/healthz", healthz),
            Route("/sim/stats", sim_stats),
        ]
    )
    app.state.stats = stats
    app.state.model = model
    return app


class _QuietCrashes(logging.Filter):
    """Keeps injected crashes out of the error log; real errors still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        return not isinstance(exc, SimulatedCrash)


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        ignore_sigterm = False

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.ignore_sigterm:
                # uvicorn installs its own SIGTERM handler before startup;
                # replacing it here makes the kernel drop the signal, so only
                # SIGKILL ends the process (a server deaf to a graceful stop).
                signal.signal(signal.SIGTERM, signal.SIG_IGN)

    return Server


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m simulator.model_server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens-per-s", type=float, default=50.0, help="<= 0: no pause between tokens")
    parser.add_argument("--prompt-delay-ms", type=float, default=0.0)
    parser.add_argument("--default-max-tokens", type=int, default=16)
    parser.add_argument("--ignore-sigterm", action="store_true", help="survive SIGTERM; only SIGKILL stops it")
    args = parser.parse_args(argv)

    app = create_app(args.model, args.tokens_per_s, args.prompt_delay_ms, args.default_max_tokens)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        http="httptools" if find_spec("httptools") else "h11",
        loop="uvloop" if find_spec("uvloop") else "asyncio",
    )
    logging.getLogger("uvicorn.error").addFilter(_QuietCrashes())
    server = _server_class()(config)
    server.ignore_sigterm = args.ignore_sigterm
    try:
        server.run()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
