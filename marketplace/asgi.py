"""One ASGI process: the lean /v1 router beside Django (dashboard, REST API, admin)."""

import os

import django
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")
django.setup()
django_app = get_asgi_application()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402

from inference.router import router  # noqa: E402  (needs settings loaded)
from marketplace.gate import ConcurrencyGate  # noqa: E402
from nodes.agent_fastpath import AgentFastPath  # noqa: E402

# Django's requests wait their turn for a pooled connection here, in the event loop.
django_gated = ConcurrencyGate(django_app, settings.DJANGO_CONCURRENCY)
# Heartbeats take the one-statement path on PostgreSQL; Django answers everything else.
agent_fastpath = AgentFastPath(fallback=django_gated) if connection.vendor == "postgresql" else None


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        await router.lifespan(receive, send, also_on_shutdown=agent_fastpath.close if agent_fastpath else None)
    elif scope["type"] == "http" and scope["path"].startswith("/v1/"):
        await router(scope, receive, send)
    elif agent_fastpath is not None and agent_fastpath.handles(scope):
        await agent_fastpath(scope, receive, send)
    else:
        await django_gated(scope, receive, send)
