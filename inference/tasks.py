from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from inference.models import RequestLog

BATCH = 5000


@shared_task(ignore_result=True)
def prune_request_log() -> int:
    """Delete request-log rows past retention, in bounded batches, re-enqueued while full."""
    cutoff = timezone.now() - timedelta(days=settings.REQUEST_LOG_RETENTION_DAYS)
    ids = list(RequestLog.objects.filter(created_at__lt=cutoff).order_by("created_at").values_list("pk", flat=True)[:BATCH])
    deleted, _ = RequestLog.objects.filter(pk__in=ids).delete()
    if len(ids) == BATCH:
        prune_request_log.delay()
    return deleted
