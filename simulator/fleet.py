"""The demo fleet: one reference agent per node of var/fleet.json, and live traffic.

`python -m simulator.fleet --config var/fleet.json --server http://127.0.0.1:8000`
starts a real `simulator.agent` process per node (each starts fake model
servers when the platform places a worker) and streams chat completions
through the router all the time, so the dashboard has something to show.
SIGTERM or Ctrl-C stops the agents (which stop their workers) and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from simulator.procs import spawn, stop_all

log = logging.getLogger("fleet")


def agent_argv(server: str, node: dict[str, Any], tokens_per_s: float) -> list[str]:
    worker_cmd = (
        "{python} -m simulator.model_server --host {host} --port {port} --model {model} "
        f"--tokens-per-s {tokens_per_s:g}"
    )
    return [
        sys.executable, "-m", "simulator.agent", "--server", server, "--token", node["token"],
        "--gpu-model", node["gpu_model"], "--vram-gb", str(node["vram_gb"]),
        "--cloud", node["cloud"], "--instance-id", node["instance_id"], "--instance-type", node["instance_type"],
        "--region", node["region"], "--zone", node["zone"], "--worker-cmd", worker_cmd,
    ]


async def traffic(server: str, api_key: str, models: list[str], concurrency: int, stop: asyncio.Event) -> None:
    """Streams chat completions through the router, a few at a time, until told to stop."""
    started = time.monotonic()
    first_token_seen = False

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal first_token_seen
        body = {
            "model": random.choice(models),
            "messages": [{"role": "user", "content": "Tell me about spot instances."}],
            "max_tokens": random.randint(16, 64),
            "stream": True,
        }
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                await asyncio.sleep(1.0)  # no ready worker yet (503) or a hiccup: back off
                return
            async for line in response.aiter_lines():
                if not first_token_seen and line.startswith("data: {") and '"content"' in line:
                    first_token_seen = True
                    # Read by the demo-start benchmark; also useful to a person watching.
                    print(f"fleet: first streamed token {time.monotonic() - started:.1f} s after the fleet started", flush=True)

    async def lane(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            try:
                await one(client)
            except httpx.HTTPError as exc:
                log.debug("traffic request failed: %s", exc)
                await asyncio.sleep(1.0)
            await asyncio.sleep(random.uniform(0.05, 0.5))

    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=server, headers=headers, timeout=httpx.Timeout(30, connect=5)) as client:
        await asyncio.gather(*(lane(client) for _ in range(concurrency)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="var/fleet.json")
    parser.add_argument("--server", default="http://127.0.0.1:8000")
    parser.add_argument("--tokens-per-s", type=float, default=20.0, help="speed of the fake model servers")
    parser.add_argument("--concurrency", type=int, default=3, help="streams in flight at once")
    parser.add_argument("--no-traffic", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fleet %(levelname)s %(message)s")

    config = json.loads(Path(args.config).read_text())
    agents = [spawn(agent_argv(args.server, node, args.tokens_per_s)) for node in config["nodes"]]
    log.info("started %d agents for %s", len(agents), ", ".join(n["name"] for n in config["nodes"]))

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    async def run() -> None:
        tasks = [asyncio.create_task(stop.wait())]
        if not args.no_traffic:
            tasks.append(asyncio.create_task(traffic(args.server, config["api_key"], config["models"], args.concurrency, stop)))
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        loop.run_until_complete(run())
    finally:
        # Agents stop their model servers on SIGTERM; give them the grace they give workers.
        stop_all(agents, grace_s=10)
        loop.close()
    log.info("fleet stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
