"""Commands to a node's agent: delivered in every heartbeat reply until acknowledged."""

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from marketplace.errors import NotFound
from nodes import events
from nodes.models import Command, CommandKind, Node, StopReason, Worker, WorkerStatus


def issue_command(*, node_id: int, kind: str, payload: dict[str, Any], worker_id: Any = None) -> Command:
    return Command.objects.create(node_id=node_id, kind=kind, payload=payload, worker_id=worker_id)


def pending_commands(*, node_id: int, now: datetime | None = None) -> list[dict[str, Any]]:
    """The unacknowledged commands of a node, marked as delivered once more."""
    now = now or timezone.now()
    rows = list(Command.objects.filter(node_id=node_id, acked_at__isnull=True).values("id", "kind", "payload"))
    if rows:
        Command.objects.filter(pk__in=[r["id"] for r in rows]).update(
            delivery_count=F("delivery_count") + 1,
            first_delivered_at=Coalesce(F("first_delivered_at"), now),
        )
    return [{"id": str(r["id"]), "kind": r["kind"], "payload": r["payload"]} for r in rows]


def ack_command(
    *, node: Node, command_id: Any, ok: bool, detail: str = "", interrupted: int | None = None
) -> Command:
    now = timezone.now()
    with transaction.atomic():
        command = Command.objects.select_for_update().filter(pk=command_id, node=node).first()
        if command is None:
            # Another node's command looks exactly like a missing one (R14).
            raise NotFound("No such command for this node.")
        if command.acked_at is not None:
            return command  # a repeated ack is harmless
        command.acked_at = now
        command.ok = ok
        command.detail = detail[:500]
        command.save(update_fields=["acked_at", "ok", "detail"])
        # The ack belongs on the drain's timeline when the command stopped a drained worker.
        reclaim_id = (
            Worker.objects.filter(pk=command.worker_id).values_list("reclaim_id", flat=True).first()
            if command.worker_id and command.kind == CommandKind.STOP_WORKER
            else None
        )
        events.record(
            node_id=node.pk,
            kind=f"{command.kind}_acked",
            reclaim_id=reclaim_id,
            worker_id=command.worker_id,
            command_id=str(command.pk),
            ok=ok,
            detail=detail[:200],
            interrupted=interrupted,
        )
        if command.kind == CommandKind.RUN_RENDER:
            from rentals.render import finish_render_job

            finish_render_job(node=node, job_id=command.payload.get("job_id"), ok=ok, detail=detail, now=now)
        if command.kind == CommandKind.START_WORKER and not ok and command.worker_id:
            # The agent could not start it: free the node for another placement.
            Worker.objects.filter(pk=command.worker_id, status=WorkerStatus.STARTING).update(
                status=WorkerStatus.LOST, stop_reason=StopReason.LOST, stopped_at=now
            )
    return command
