"""Cloud preemption notices as received, what shadow mode predicted, per-cloud policy, counters."""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class Source(models.TextChoices):
    AWS = "aws"
    AZURE = "azure"
    GCP = "gcp"
    GENERIC = "generic"


class Kind(models.TextChoices):
    TERMINATE = "terminate"
    STOP = "stop"
    HIBERNATE = "hibernate"
    REBALANCE = "rebalance"


# The machine goes away on these; a rebalance recommendation is only a soft signal.
LOSING_KINDS = (Kind.TERMINATE, Kind.STOP, Kind.HIBERNATE)


class Mode(models.TextChoices):
    OFF = "off"
    SHADOW = "shadow"
    PROD = "prod"


class Action(models.TextChoices):
    IGNORED = "ignored"
    WOULD_RECLAIM_SPOT = "would_reclaim_spot"
    RECLAIMED = "reclaimed"
    NO_NODE = "no_node"


class Via(models.TextChoices):
    WEBHOOK = "webhook"
    AGENT = "agent"


class PreemptionPolicy(models.Model):
    """Per-cloud override of settings.PREEMPTION_MODE, edited by staff in the admin.

    A cloud without a row, or with mode left blank, follows the setting.
    """

    source = models.CharField(max_length=16, choices=Source.choices, unique=True)
    mode = models.CharField(
        max_length=8, choices=Mode.choices, blank=True, default="", help_text="Blank: follow PREEMPTION_MODE."
    )
    drain_on_rebalance = models.BooleanField(
        default=False, help_text="Drain a node on a rebalance recommendation, not only mark it at risk."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["source"]
        verbose_name_plural = "preemption policies"

    def __str__(self) -> str:
        return f"{self.source}: {self.mode or 'default'}"


class ShadowReclaim(models.Model):
    """What prod mode would have done with a notice: a prediction, never a drain.

    Kept apart from nodes.Reclaim on purpose: nothing that counts, finishes or
    lists drains can ever mistake a prediction for one.
    """

    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="shadow_reclaims")
    started_at = models.DateTimeField(default=timezone.now)
    not_before = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField()
    in_flight_at_start = models.PositiveIntegerField(default=0)
    would_cut = models.PositiveIntegerField(default=0, help_text="Expected to run past the deadline.")
    may_cut = models.PositiveIntegerField(default=0, help_text="Could run past it at the longest the router allows.")
    rentals_noticed = models.PositiveIntegerField(default=0)
    predicted = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["node", "started_at"])]

    def __str__(self) -> str:
        return f"shadow reclaim {self.pk} of node {self.node_id}"


class PreemptionNotice(models.Model):
    """One cloud notice as received. (source, external_id) is unique: a redelivery is the same row."""

    source = models.CharField(max_length=16, choices=Source.choices)
    external_id = models.CharField(max_length=255)
    via = models.CharField(max_length=8, choices=Via.choices, default=Via.WEBHOOK)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    instance_id = models.CharField(max_length=255, blank=True, default="")
    node = models.ForeignKey(
        "nodes.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="preemption_notices"
    )
    not_before = models.DateTimeField(null=True, blank=True)
    received_at = models.DateTimeField(default=timezone.now)
    mode = models.CharField(max_length=8, choices=Mode.choices)
    action = models.CharField(max_length=24, choices=Action.choices)
    # True when nothing new happened: the node's state already held this interruption.
    duplicate = models.BooleanField(default=False)
    incarnation = models.BigIntegerField(null=True, blank=True, help_text="Azure DocumentIncarnation.")
    reclaim = models.ForeignKey(
        "nodes.Reclaim", null=True, blank=True, on_delete=models.SET_NULL, related_name="preemption_notices"
    )
    shadow_reclaim = models.ForeignKey(
        ShadowReclaim, null=True, blank=True, on_delete=models.SET_NULL, related_name="notices"
    )
    at_risk_until = models.DateTimeField(null=True, blank=True)
    document = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-received_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["source", "external_id"], name="notice_unique_per_source"),
        ]
        indexes = [
            models.Index(fields=["node", "received_at"]),
            models.Index(fields=["received_at"]),
            models.Index(fields=["node", "incarnation"], name="notice_incarnation", condition=Q(source="azure")),
        ]

    def __str__(self) -> str:
        return f"{self.source} {self.kind} {self.external_id}"


class NoticeCount(models.Model):
    """Receipt counters by source, kind, mode and action (Prometheus counters, kept in the database).

    Off mode records nothing else. Incremented after the notice commits, in a
    statement of its own, so a burst of notices never queues on one row.
    """

    source = models.CharField(max_length=16)
    kind = models.CharField(max_length=16, blank=True, default="")
    mode = models.CharField(max_length=8)
    action = models.CharField(max_length=24)
    count = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["source", "kind", "mode", "action"]
        constraints = [
            models.UniqueConstraint(fields=["source", "kind", "mode", "action"], name="notice_count_labels"),
        ]

    def __str__(self) -> str:
        return f"{self.source}/{self.kind or '-'}/{self.mode}/{self.action}: {self.count}"


class OnDemandPrice(models.Model):
    """The cloud's on-demand price for an instance type: what realised spot discounts compare against."""

    cloud = models.CharField(max_length=32)
    instance_type = models.CharField(max_length=64)
    price_per_hour = models.DecimalField(max_digits=10, decimal_places=4)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["cloud", "instance_type"]
        constraints = [models.UniqueConstraint(fields=["cloud", "instance_type"], name="on_demand_price_per_type")]

    def __str__(self) -> str:
        return f"{self.cloud} {self.instance_type}: {self.price_per_hour}/h"
