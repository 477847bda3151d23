"""The OpenAI-compatible router: a lean ASGI app for /v1, beside Django in marketplace.asgi.

Why not a Django view: Django's request cycle costs about half the router's
throughput, and a cancelled view never runs an awaited release in `finally`
(slots leaked when clients disconnected). Here the rules stay in
`nodes.slots` (admission is the same conditional UPDATE), and a release is
handed over synchronously in `finally` to a loop that writes releases in
batches, so no cancellation can skip it; the heartbeat guard releases the
slots of a router that died.
"""

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from django.conf import settings

from inference.keys import KeyCache, hash_key
from marketplace import metrics
from inference.models import Outcome
from inference.store import Store, make_store
from nodes.slots import Admission

log = logging.getLogger("inference.router")

Scope = dict[str, Any]

MAX_BODY_BYTES = 4 * 1024 * 1024
RETRY_STATUSES = {429, 500, 502, 503, 504}


class ClientGone(Exception):
    """The client disconnected while we were streaming to it."""


def error_body(message: str, type_: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "code": code}}).encode()


def sse_error(message: str, code: str) -> bytes:
    payload = {"error": {"message": message, "type": "stream_interrupted", "code": code}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


@dataclass
class Flight:
    """One admitted request, as the cut poller sees it."""

    admission: Admission
    registered: float = field(default_factory=time.monotonic)
    response: aiohttp.ClientResponse | None = None
    cut: bool = False


class Router:
    def __init__(self, store: Store | None = None):
        self.instance_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.store = store
        self.session: aiohttp.ClientSession | None = None
        self.keys = KeyCache(ttl_s=settings.ROUTER_KEY_CACHE_S)
        self._models: dict[str, dict[str, Any]] = {}
        self._models_at = 0.0
        self.flights: dict[str, Flight] = {}
        self.log_buffer: list[dict[str, Any]] = []
        self._tasks: list[asyncio.Task] = []
        self.releases: list[Admission] = []
        self._release_wanted = asyncio.Event()
        self._releases_idle = asyncio.Event()
        self._releases_idle.set()
        self._flush_lock = asyncio.Lock()
        self._started = False
        self._start_lock = asyncio.Lock()

    # --- lifecycle -------------------------------------------------------------

    async def ensure_started(self) -> None:
        if self._started:
            return
        async with self._start_lock:
            if self._started:
                return
            self.store = self.store or make_store()
            await self.store.start()
            self.session = aiohttp.ClientSession(
                # Model servers (uvicorn, vLLM) close idle connections after 5 s:
                # never reuse one idle longer than 3 s, or a healthy worker looks dead.
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True, keepalive_timeout=3),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=settings.ROUTER_CONNECT_TIMEOUT_S),
                auto_decompress=False,
            )
            await self.store.beat(self.instance_id)
            self._tasks = [
                asyncio.create_task(self._beat_loop()),
                asyncio.create_task(self._cut_loop()),
                asyncio.create_task(self._log_loop()),
                asyncio.create_task(self._release_loop()),
            ]
            self._started = True
            log.info("router_started instance=%s store=%s", self.instance_id, type(self.store).__name__)

    async def shutdown(self) -> None:
        await self.settle()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._flush_logs()
        if self.session is not None:
            await self.session.close()
        if self.store is not None:
            await self.store.close()
        self._started = False

    async def _beat_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.ROUTER_EXPIRY_S / 3)
            try:
                await self.store.beat(self.instance_id)
            except Exception:
                log.exception("router_beat_failed instance=%s", self.instance_id)

    async def _cut_loop(self) -> None:
        """Cut our streams whose slot the drain's deadline took away (R5, R6)."""
        while True:
            await asyncio.sleep(settings.ROUTER_CUT_POLL_S)
            if not self.flights:
                continue
            # A flight registered before we ask had its slot committed before the
            # query's snapshot: missing from the answer means the drain took it.
            # Flights registered later are left for the next poll.
            asked = time.monotonic()
            try:
                alive = await self.store.router_slots(self.instance_id)
            except Exception:
                log.exception("router_cut_poll_failed")
                continue
            for slot_id, flight in list(self.flights.items()):
                if slot_id not in alive and flight.registered < asked and not flight.cut:
                    flight.cut = True
                    if flight.response is not None:
                        flight.response.close()

    def release(self, admission: Admission) -> None:
        """Hand a slot back. Synchronous, so no cancellation can skip it; the
        release loop writes it, batched with others under load."""
        self.releases.append(admission)
        self._releases_idle.clear()
        self._release_wanted.set()

    async def _release_loop(self) -> None:
        while True:
            await self._release_wanted.wait()
            self._release_wanted.clear()
            batch, self.releases = self.releases, []
            if batch:
                try:
                    await self.store.release_many(batch)
                except Exception:
                    # Keep them for the next pass; the guard is the last resort.
                    log.exception("slot_release_failed slots=%d", len(batch))
                    self.releases[:0] = batch
                    await asyncio.sleep(0.5)
                    self._release_wanted.set()
                    continue
            if not self.releases:
                self._releases_idle.set()

    async def settle(self) -> None:
        """Wait until every released slot is written and the log flushed (tests, shutdown)."""
        if self._tasks:
            await asyncio.wait_for(self._releases_idle.wait(), timeout=10)
        await self._flush_logs()

    async def _log_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.ROUTER_LOG_FLUSH_S)
            await self._flush_logs()

    async def _flush_logs(self) -> None:
        # One flush at a time, so a caller that finds the buffer empty knows the
        # rows taken by a flush in progress are written when it gets the lock.
        async with self._flush_lock:
            if not self.log_buffer:
                return
            rows, self.log_buffer = self.log_buffer, []
            try:
                await self.store.write_logs(rows)
            except Exception:
                log.exception("request_log_flush_failed rows=%d", len(rows))

    # --- lookups -----------------------------------------------------------------

    async def models(self) -> dict[str, dict[str, Any]]:
        if time.monotonic() - self._models_at > settings.ROUTER_MODEL_CACHE_S:
            self._models = {m["name"]: m for m in await self.store.models()}
            self._models_at = time.monotonic()
        return self._models

    async def authenticate(self, scope: Scope) -> tuple[bool, int | None]:
        header = _header(scope, b"authorization")
        if not header or not header.lower().startswith("bearer "):
            return False, None
        key_hash = hash_key(header[7:].strip())
        hit, key_id = self.keys.get(key_hash)
        if not hit:
            key_id = await self.store.api_key_id(key_hash)
            self.keys.put(key_hash, key_id)
        return key_id is not None, key_id

    # --- ASGI --------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        await self.ensure_started()
        request_id = _header(scope, b"x-request-id") or uuid.uuid4().hex
        path, method = scope["path"], scope["method"]
        ok, key_id = await self.authenticate(scope)
        if path in ("/v1/models", "/v1/models/"):
            if method != "GET":
                return await _reply(send, 405, error_body("Use GET.", "invalid_request_error", "method_not_allowed"), request_id)
            if not ok:
                return await _unauthorized(send, request_id)
            return await self._list_models(send, request_id)
        if path in ("/v1/chat/completions", "/v1/completions"):
            if method != "POST":
                return await _reply(send, 405, error_body("Use POST.", "invalid_request_error", "method_not_allowed"), request_id)
            if not ok:
                return await _unauthorized(send, request_id)
            return await self._complete(scope, receive, send, request_id, key_id)
        await _reply(send, 404, error_body(f"No route {path}.", "invalid_request_error", "not_found"), request_id)

    async def lifespan(self, receive: Any, send: Any, *, also_on_shutdown: Any = None) -> None:
        """ASGI lifespan: start the router's loops, and on shutdown settle and close
        (then `also_on_shutdown`, for what the process mounts beside the router)."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.ensure_started()
                except Exception as exc:  # the server must not start half-configured
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                if also_on_shutdown is not None:
                    await also_on_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _list_models(self, send: Any, request_id: str) -> None:
        models = await self.models()
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "marketplace"} for name in models]
        await _reply(send, 200, json.dumps({"object": "list", "data": data}).encode(), request_id)

    # --- completions -------------------------------------------------------------

    async def _complete(self, scope: Scope, receive: Any, send: Any, request_id: str, key_id: int | None) -> None:
        started = time.monotonic()
        raw = await _read_body(receive)
        if raw is None:
            return await _reply(send, 413, error_body("Request body too large.", "invalid_request_error", "body_too_large"), request_id)
        try:
            payload = json.loads(raw)
            if not isinstance(payload, dict):
                raise ValueError("not an object")
        except ValueError:
            return await _reply(send, 400, error_body("The body is not a JSON object.", "invalid_request_error", "invalid_json"), request_id)
        name = payload.get("model")
        model = (await self.models()).get(name) if isinstance(name, str) else None
        if model is None:
            return await _reply(
                send, 404, error_body(f"The model {name!r} does not exist.", "invalid_request_error", "model_not_found"), request_id
            )
        stream = payload.get("stream") is True
        requested = payload.get("max_tokens") or payload.get("max_completion_tokens")
        if requested is not None and (not isinstance(requested, int) or requested < 1):
            return await _reply(send, 400, error_body("max_tokens must be a positive integer.", "invalid_request_error", "invalid_max_tokens"), request_id)
        cap = max(1, int(model["tokens_per_s"] * settings.SPOT_GENERATION_WINDOW_S))
        record: dict[str, Any] = {
            "request_id": request_id, "api_key_id": key_id, "model": name, "stream": stream, "attempts": 0,
            "created_at": datetime.now(UTC),
        }
        record["started"] = started
        try:
            await self._serve(scope, receive, send, request_id, payload, raw, model, stream, requested, cap, record)
        finally:
            record.pop("started", None)
            record["duration_ms"] = round((time.monotonic() - started) * 1000, 3)
            if record.get("ttft_ms") is not None:
                record["ttft_ms"] = round((record["ttft_ms"] - started) * 1000, 3)
            self.log_buffer.append(record)
            metrics.ROUTER_REQUESTS.labels(record.get("outcome", "rejected")).inc()
            if record.get("added_s") is not None:
                metrics.ROUTER_ADDED_LATENCY.observe(record.pop("added_s"))

    async def _serve(
        self, scope: Scope, receive: Any, send: Any, request_id: str, payload: dict[str, Any], raw: bytes,
        model: dict[str, Any], stream: bool, requested: int | None, cap: int, record: dict[str, Any],
    ) -> None:
        path = scope["path"]
        tried: list[str] = []
        prefer_on_demand = requested is not None and requested > cap
        for attempt in range(1 + settings.ROUTER_RETRIES):
            admission = await self.store.admit(
                model_id=model["id"], router=self.instance_id, request_id=request_id, exclude=tried,
                prefer_on_demand=prefer_on_demand,
            )
            if admission is None:
                break
            record["attempts"] = attempt + 1
            tried.append(admission.worker_id)
            record.update(worker_id=admission.worker_id, node_id=admission.node_id, is_spot=admission.is_spot, admitted_at=admission.acquired_at)
            body, applied_cap = raw, None
            if admission.is_spot and (requested is None or requested > cap):
                # A spot worker may get two minutes' notice: keep generation inside it.
                capped = dict(payload, max_tokens=cap)
                if "max_completion_tokens" in capped:
                    capped["max_completion_tokens"] = cap
                body, applied_cap = json.dumps(capped).encode(), cap
            record["max_tokens_cap"] = applied_cap
            flight = Flight(admission)
            self.flights[admission.slot_id] = flight
            try:
                served = await self._forward(scope, receive, send, request_id, admission, flight, path, body, stream, applied_cap, record)
            finally:
                self.flights.pop(admission.slot_id, None)
                self.release(admission)
            if served:
                if record["outcome"] == Outcome.COMPLETED and attempt > 0:
                    record["outcome"] = Outcome.FAILED_OVER
                return
        if tried:
            record.update(outcome=Outcome.REJECTED, status_code=502, error_code="upstream_unavailable")
            await _reply(send, 502, error_body("Every worker tried failed before answering.", "server_error", "upstream_unavailable"), request_id)
        else:
            record.update(outcome=Outcome.REJECTED, status_code=503, error_code="no_capacity")
            await _reply(
                send, 503, error_body(f"No ready worker has a free slot for {model['name']!r}.", "server_error", "no_capacity"),
                request_id, extra=[(b"retry-after", b"1")],
            )

    async def _forward(
        self, scope: Scope, receive: Any, send: Any, request_id: str, admission: Admission, flight: Flight,
        path: str, body: bytes, stream: bool, cap: int | None, record: dict[str, Any],
    ) -> bool:
        """Returns False to fail over (nothing reached the client yet), True once answered."""
        url = admission.endpoint.rstrip("/") + path
        headers = {"content-type": "application/json", "x-request-id": request_id}
        for name in (b"x-sim-die-after", b"x-sim-status"):
            value = _header(scope, name)
            if value is not None and settings.ROUTER_PASS_SIM_HEADERS:
                headers[name.decode()] = value
        if record.get("added_s") is None:
            # What the router adds before the worker sees the request: body
            # parsing, authentication, admission, the spot cap.
            record["added_s"] = time.monotonic() - record["started"]
        try:
            response = await self.session.post(url, data=body, headers=headers)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return False
        flight.response = response
        if response.status in RETRY_STATUSES:
            response.release()
            return False
        extra = [(b"x-worker-id", admission.worker_id.encode())]
        if cap is not None:
            extra.append((b"x-max-tokens-cap", str(cap).encode()))
        content_type = response.headers.get("content-type", "application/json").encode()
        if not stream or not content_type.startswith(b"text/event-stream"):
            return await self._forward_whole(send, request_id, response, flight, content_type, extra, record)
        return await self._forward_stream(receive, send, request_id, response, flight, content_type, extra, record)

    async def _forward_whole(self, send, request_id, response, flight, content_type, extra, record) -> bool:
        try:
            data = await response.read()
            record["ttft_ms"] = time.monotonic()
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            code = await self._cut_code(flight)
            record.update(outcome=Outcome.INTERRUPTED, status_code=502, error_code=code)
            message = "The worker was reclaimed before it answered." if code == "worker_reclaimed" else "The worker went away before it answered."
            await _reply(send, 502, json.dumps({"error": {"message": message, "type": "stream_interrupted", "code": code}}).encode(), request_id)
            return True
        finally:
            response.release()
        record.update(outcome=Outcome.COMPLETED, status_code=response.status)
        if response.status == 200 and b'"usage"' in data:
            try:
                usage = json.loads(data).get("usage") or {}
                record.update(tokens_in=usage.get("prompt_tokens"), tokens_out=usage.get("completion_tokens"))
            except ValueError:
                pass
        await _reply(send, response.status, data, request_id, extra=extra, content_type=content_type)
        return True

    async def _forward_stream(self, receive, send, request_id, response, flight, content_type, extra, record) -> bool:
        await send({
            "type": "http.response.start",
            "status": response.status,
            "headers": [(b"content-type", content_type), (b"cache-control", b"no-cache"), (b"x-request-id", request_id.encode()), *extra],
        })
        gone = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(receive, gone, response))
        tail = b""
        done = False
        try:
            async for chunk in response.content.iter_any():
                if record.get("ttft_ms") is None:
                    record["ttft_ms"] = time.monotonic()
                if gone.is_set():
                    raise ClientGone()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                window = tail + chunk
                if b"[DONE]" in window:
                    done = True
                if b'"usage"' in chunk:
                    _usage_from_sse(chunk, record)
                tail = window[-16:]
            if not done:
                raise aiohttp.ClientPayloadError("stream ended without [DONE]")
            record.update(outcome=Outcome.COMPLETED, status_code=response.status)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ClientGone):
            if gone.is_set():
                record.update(outcome=Outcome.CLIENT_CANCELLED, status_code=499)
                return True
            code = await self._cut_code(flight)
            record.update(outcome=Outcome.INTERRUPTED, status_code=response.status, error_code=code)
            message = (
                "The worker was reclaimed at its drain deadline; this answer is incomplete."
                if code == "worker_reclaimed"
                else "The connection to the worker broke; this answer is incomplete."
            )
            await _send_quietly(send, {"type": "http.response.body", "body": sse_error(message, code), "more_body": True})
        finally:
            watcher.cancel()
            response.release()
        await _send_quietly(send, {"type": "http.response.body", "body": b"", "more_body": False})
        return True

    async def _cut_code(self, flight: Flight) -> str:
        if flight.cut:
            return "worker_reclaimed"
        try:
            exists = await self.store.slot_exists(flight.admission.slot_id)
        except Exception:
            exists = True
        return "upstream_disconnected" if exists else "worker_reclaimed"


# --- small ASGI helpers -------------------------------------------------------------


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


async def _read_body(receive: Any) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _reply(
    send: Any, status: int, body: bytes, request_id: str, *, extra: list | None = None, content_type: bytes = b"application/json"
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), (b"x-request-id", request_id.encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


async def _unauthorized(send: Any, request_id: str) -> None:
    await _reply(send, 401, error_body("Missing or invalid API key.", "invalid_request_error", "invalid_api_key"), request_id)


async def _send_quietly(send: Any, message: dict[str, Any]) -> None:
    try:
        await send(message)
    except Exception:  # the client is gone; nothing left to tell it
        pass


async def _watch_disconnect(receive: Any, gone: asyncio.Event, response: aiohttp.ClientResponse) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            response.close()  # wakes the stream loop at once
            return


def _usage_from_sse(chunk: bytes, record: dict[str, Any]) -> None:
    for line in chunk.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage"' in line:
            try:
                usage = json.loads(line[6:]).get("usage") or {}
            except ValueError:
                continue
            if usage:
                record.update(tokens_in=usage.get("prompt_tokens"), tokens_out=usage.get("completion_tokens"))


router = Router()
