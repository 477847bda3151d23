import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


def new_notice_token() -> str:
    return secrets.token_urlsafe(24)


class RentalStatus(models.TextChoices):
    ACTIVE = "active"
    RECLAIMING = "reclaiming"
    ENDED = "ended"


OPEN_RENTAL_STATUSES = (RentalStatus.ACTIVE, RentalStatus.RECLAIMING)


class EndReason(models.TextChoices):
    RENTER = "renter"
    TERM = "term"
    PROVIDER = "provider"
    SPOT_RECLAIM = "spot_reclaim"
    NODE_LOST = "node_lost"


class Rental(models.Model):
    node = models.ForeignKey("nodes.Node", on_delete=models.PROTECT, related_name="rentals")
    renter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="rentals")
    # R10: copied from the node under its row lock at start, never changed.
    is_spot = models.BooleanField()
    status = models.CharField(max_length=16, choices=RentalStatus.choices, default=RentalStatus.ACTIVE)
    started_at = models.DateTimeField(default=timezone.now)
    term_ends_at = models.DateTimeField(null=True, blank=True)
    reclaim_at = models.DateTimeField(null=True, blank=True)
    reclaim = models.ForeignKey("nodes.Reclaim", null=True, blank=True, on_delete=models.SET_NULL, related_name="rentals")
    # When start_rental went to the agent: only once the node's workers stopped.
    start_commanded_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=16, choices=EndReason.choices, blank=True, default="")
    notice_token = models.CharField(max_length=64, unique=True, default=new_notice_token)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [
            models.Index(fields=["reclaim_at"], name="rental_reclaim_due", condition=Q(status="reclaiming")),
            models.Index(fields=["term_ends_at"], name="rental_term_due", condition=Q(status="active")),
            models.Index(fields=["node", "status"]),
            models.Index(fields=["renter", "started_at"]),
        ]
        constraints = [
            # One open rental per node, enforced by the database as well as the lock.
            models.UniqueConstraint(fields=["node"], condition=Q(status__in=["active", "reclaiming"]), name="one_open_rental_per_node"),
        ]

    def __str__(self) -> str:
        return f"rental {self.pk} of node {self.node_id} ({self.status})"


class RenderStatus(models.TextChoices):
    QUEUED = "queued"
    ASSIGNED = "assigned"  # its node's inference workers are draining first
    RUNNING = "running"  # run_render sent to the agent
    DONE = "done"
    FAILED = "failed"


ACTIVE_RENDER_STATUSES = (RenderStatus.ASSIGNED, RenderStatus.RUNNING)


class RenderJob(models.Model):
    """A frame range to render; only ever placed on an on-demand node (R3)."""

    renter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="render_jobs")
    frames = models.CharField(max_length=200)
    frame_count = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=RenderStatus.choices, default=RenderStatus.QUEUED)
    node = models.ForeignKey("nodes.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="render_jobs")
    created_at = models.DateTimeField(default=timezone.now)
    assigned_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    detail = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["created_at"], name="render_queued", condition=Q(status="queued")),
            models.Index(fields=["node", "status"]),
        ]
