import uuid
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class NodeState(models.TextChoices):
    AVAILABLE = "available"
    PAUSED = "paused"
    DRAINING = "draining"
    RENTED = "rented"
    OFFLINE = "offline"


class Node(models.Model):
    provider = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=100)
    gpu_model = models.CharField(max_length=64, blank=True, default="")
    gpu_count = models.PositiveIntegerField(default=1)
    vram_gb = models.PositiveIntegerField(default=0)
    # Capacity pool: interruptions are counted per (cloud, instance_type, zone).
    cloud = models.CharField(max_length=32, blank=True, default="")
    instance_type = models.CharField(max_length=64, blank=True, default="")
    region = models.CharField(max_length=64, blank=True, default="")
    zone = models.CharField(max_length=64, blank=True, default="")
    cloud_instance_id = models.CharField(max_length=128, blank=True, default="", db_index=True)
    is_spot = models.BooleanField(default=False)
    # R1: the one flag that decides whether the node may hold workload.
    workload_enabled = models.BooleanField(default=True)
    price_per_hour = models.DecimalField(max_digits=10, decimal_places=4, default=0)
    agent_token_hash = models.CharField(max_length=64, unique=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # A cloud's rebalance recommendation: placement puts no new work here until then.
    at_risk_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["provider", "id"])]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"

    def is_online(self, now=None) -> bool:
        now = now or timezone.now()
        if self.last_seen_at is None:
            return False
        return now - self.last_seen_at < timedelta(seconds=settings.NODE_OFFLINE_S)


class ServedModel(models.Model):
    name = models.CharField(max_length=128, unique=True)
    min_vram_gb = models.PositiveIntegerField(default=0)
    typical_tokens_per_s = models.FloatField(default=50.0)
    target_replicas = models.PositiveIntegerField(default=1)
    # Replicas kept on on-demand nodes, so a wave of spot reclaims never takes
    # the model away entirely.
    min_on_demand_replicas = models.PositiveIntegerField(default=0)
    max_slots = models.PositiveIntegerField(default=8)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class WorkerStatus(models.TextChoices):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    LOST = "lost"


LIVE_WORKER_STATUSES = (WorkerStatus.STARTING, WorkerStatus.READY, WorkerStatus.DRAINING)
SERVING_WORKER_STATUSES = (WorkerStatus.STARTING, WorkerStatus.READY)


class StopReason(models.TextChoices):
    DRAINED = "drained"
    CEILING = "ceiling"
    LOST = "lost"
    AGENT_RESTART = "agent_restart"


class Worker(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="workers")
    model = models.ForeignKey(ServedModel, on_delete=models.PROTECT, related_name="workers")
    endpoint = models.CharField(max_length=255, blank=True, default="")
    status = models.CharField(max_length=16, choices=WorkerStatus.choices, default=WorkerStatus.STARTING)
    max_slots = models.PositiveIntegerField(default=8)
    # The count of this worker's Slot rows, kept in the same transactions that
    # add and remove them, so admission is one conditional UPDATE.
    in_flight = models.PositiveIntegerField(default=0)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)
    drain_started_at = models.DateTimeField(null=True, blank=True)
    drain_deadline = models.DateTimeField(null=True, blank=True)
    in_flight_at_drain = models.PositiveIntegerField(default=0)
    reclaim = models.ForeignKey("Reclaim", null=True, blank=True, on_delete=models.SET_NULL, related_name="workers")
    stopped_at = models.DateTimeField(null=True, blank=True)
    stop_reason = models.CharField(max_length=16, choices=StopReason.choices, blank=True, default="")
    requests_cut = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["created_at"]
        indexes = [
            # The drain tick scans these; only draining rows are in the index.
            models.Index(fields=["drain_deadline"], name="worker_drain_due", condition=Q(status="draining")),
            models.Index(
                fields=["expires_at"], name="worker_expiry_due", condition=Q(status__in=["starting", "ready"])
            ),
            models.Index(fields=["model", "status"], name="worker_model_status"),
            models.Index(fields=["node", "status"], name="worker_node_status"),
        ]

    def __str__(self) -> str:
        return f"worker {self.pk} ({self.status})"


class RouterInstance(models.Model):
    """A router process that holds slot leases; its heartbeat keeps them alive."""

    id = models.CharField(primary_key=True, max_length=64)
    started_at = models.DateTimeField(default=timezone.now)
    last_beat_at = models.DateTimeField(default=timezone.now, db_index=True)


class Slot(models.Model):
    """One in-flight router request on a worker: a lease owned by a router instance."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="slots")
    router_instance = models.CharField(max_length=64, db_index=True)
    request_id = models.CharField(max_length=64, blank=True, default="")
    acquired_at = models.DateTimeField(default=timezone.now)


class CommandKind(models.TextChoices):
    START_WORKER = "start_worker"
    STOP_WORKER = "stop_worker"
    START_RENTAL = "start_rental"
    STOP_RENTAL = "stop_rental"
    RUN_RENDER = "run_render"


class Command(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="commands")
    worker = models.ForeignKey(Worker, null=True, blank=True, on_delete=models.CASCADE, related_name="commands")
    kind = models.CharField(max_length=16, choices=CommandKind.choices)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)
    first_delivered_at = models.DateTimeField(null=True, blank=True)
    delivery_count = models.PositiveIntegerField(default=0)
    acked_at = models.DateTimeField(null=True, blank=True)
    ok = models.BooleanField(null=True)
    detail = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["created_at"]
        indexes = [
            models.Index(fields=["node", "created_at"], name="command_pending", condition=Q(acked_at__isnull=True)),
        ]


class ReclaimTrigger(models.TextChoices):
    OWNER_PAUSE = "owner_pause"
    PREEMPTION = "preemption"
    RECOVERY = "recovery"
    LATE_REGISTRATION = "late_registration"
    RENTAL_START = "rental_start"


class Reclaim(models.Model):
    """One drain of a node's workload: its timeline and, but for rental_start, an interruption."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="reclaims")
    trigger = models.CharField(max_length=24, choices=ReclaimTrigger.choices)
    started_at = models.DateTimeField(default=timezone.now)
    deadline = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    resumed_at = models.DateTimeField(null=True, blank=True)
    in_flight_at_start = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    cut = models.PositiveIntegerField(default=0)
    rentals_noticed = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [
            models.Index(fields=["node", "started_at"]),
            models.Index(fields=["deadline"], name="reclaim_open", condition=Q(finished_at__isnull=True)),
            # Placement's "was this pool preempted in the last few minutes?"
            models.Index(fields=["started_at"], name="reclaim_preemption", condition=Q(trigger="preemption")),
        ]

    @property
    def counts_as_interruption(self) -> bool:
        return self.trigger != ReclaimTrigger.RENTAL_START


class NodeEvent(models.Model):
    """Append-only record of every transition, read back as a node's or a drain's timeline."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    reclaim = models.ForeignKey(Reclaim, null=True, blank=True, on_delete=models.CASCADE, related_name="events")
    worker = models.ForeignKey(Worker, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    kind = models.CharField(max_length=32)
    at = models.DateTimeField(default=timezone.now)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["node", "at"])]
