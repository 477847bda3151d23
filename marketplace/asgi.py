"""One ASGI process: the lean /v1 router beside Django (dashboard, REST API, admin)."""

import os

import django
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")
django.setup()
django_app = get_asgi_application()

from inference.router import router  # noqa: E402  (needs settings loaded)


async def application(scope, receive, send):
    if scope["type"] == "lifespan" or (scope["type"] == "http" and scope["path"].startswith("/v1/")):
        await router(scope, receive, send)
    else:
        await django_app(scope, receive, send)
