"""/healthz: the process answers. /readyz: the database and the broker answer too."""

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


def _database_ok() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return None
    except Exception as exc:  # whatever the driver raises, the answer is "down"
        return f"database ({connection.vendor}): {exc.__class__.__name__}"


def _broker_ok() -> str | None:
    from marketplace.celery import app

    url = settings.CELERY_BROKER_URL
    kind = "redis" if url.startswith("redis") else url.split(":", 1)[0]
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=0, timeout=settings.READYZ_TIMEOUT_S)
        return None
    except Exception as exc:
        return f"broker ({kind}): {exc.__class__.__name__}"


def readyz(request: HttpRequest) -> JsonResponse:
    down = [problem for problem in (_database_ok(), _broker_ok()) if problem]
    return JsonResponse({"ok": not down, "down": down}, status=503 if down else 200)
