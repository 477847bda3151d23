"""A burst of agents larger than a web process's connection pool: every hello is answered, none fails.

Found by the soak (`make soak`): 2,000 agents saying hello at once made one
uvicorn process start a thread per Django request; the threads queued on the
process's DB_POOL_MAX pooled connections and those still waiting after
DB_POOL_TIMEOUT_S answered 500 (PoolTimeout). marketplace.gate now queues
Django requests in the event loop, DJANGO_CONCURRENCY at a time.
"""

from __future__ import annotations

import asyncio
import secrets

import httpx
import pytest

from simulator.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

AGENTS = 200
# A pool far smaller than the burst, and a pool timeout the queue would exceed
# (200 placements at several ms each, two at a time, take well over a second).
TIGHT_POOL = {"DB_POOL_MAX": 2, "DB_POOL_TIMEOUT_S": 1}


def test_burst_of_agent_hellos_beyond_the_db_pool_is_queued_not_failed(stack: Stack, owner_api: httpx.Client) -> None:
    tokens = []
    for i in range(AGENTS):
        response = owner_api.post(
            "/api/v1/nodes", json={"name": f"burst-{i}-{secrets.token_hex(3)}", "is_spot": True, "price_per_hour": "1.00"}
        )
        assert response.status_code == 201, response.text
        tokens.append(response.json()["agent_token"])
    web = stack.start_web(TIGHT_POOL, name="web-tight-pool")

    async def burst() -> list[int]:
        limits = httpx.Limits(max_connections=AGENTS, max_keepalive_connections=AGENTS)
        async with httpx.AsyncClient(base_url=web.url, limits=limits, timeout=60, trust_env=False) as client:
            async def hello(token: str) -> int:
                response = await client.post(
                    "/api/v1/agent/hello",
                    headers={"Authorization": f"Bearer {token}"},
                    json={
                        "hardware": {"gpu_model": "A100", "gpu_count": 1, "vram_gb": 80},
                        "cloud": {"provider": "aws", "instance_id": f"i-{secrets.token_hex(6)}",
                                  "instance_type": "g5.xlarge", "region": "us-east-1", "zone": "us-east-1a"},
                    },
                )
                return response.status_code

            return await asyncio.gather(*(hello(t) for t in tokens))

    statuses = asyncio.run(burst())
    assert statuses == [200] * AGENTS, sorted(set(statuses))
    assert "PoolTimeout" not in web.proc.log_tail(200)
