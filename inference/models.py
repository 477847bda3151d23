from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiKey(models.Model):
    """An inference client's key: shown once, stored as a SHA-256 hash."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class Outcome(models.TextChoices):
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED_OVER = "failed_over"  # completed, but only after another worker failed first
    REJECTED = "rejected"
    CLIENT_CANCELLED = "client_cancelled"


class RequestLog(models.Model):
    """One row per router request, written in small batches off the hot path."""

    request_id = models.CharField(max_length=64, db_index=True)
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    model = models.CharField(max_length=128)
    worker_id = models.UUIDField(null=True, blank=True)
    node_id = models.BigIntegerField(null=True, blank=True)
    is_spot = models.BooleanField(null=True)
    stream = models.BooleanField(default=False)
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    error_code = models.CharField(max_length=40, blank=True, default="")
    status_code = models.PositiveSmallIntegerField(default=200)
    attempts = models.PositiveSmallIntegerField(default=1)
    max_tokens_cap = models.PositiveIntegerField(null=True, blank=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    ttft_ms = models.FloatField(null=True, blank=True)
    duration_ms = models.FloatField(default=0)
    tokens_in = models.PositiveIntegerField(null=True, blank=True)
    tokens_out = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["created_at"]),
            models.Index(fields=["node_id", "admitted_at"]),
            models.Index(fields=["outcome", "created_at"]),
        ]
