"""Render jobs: queued, placed only on on-demand nodes (R3), run by the node's agent."""

import re
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from marketplace.enqueue import enqueue
from nodes import events
from nodes.commands import issue_command
from nodes.drain import start_node_drain
from nodes.models import LIVE_WORKER_STATUSES, SERVING_WORKER_STATUSES, CommandKind, Node, ReclaimTrigger, Worker
from nodes.placement import may_run_render, pick_render_node, place_worker
from rentals.models import ACTIVE_RENDER_STATUSES, RenderJob, RenderStatus

FRAMES = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")
MAX_FRAMES = 1_000_000


def parse_frames(spec: str) -> int:
    """Frames as "1-240" or "1,5,10-12": the number of frames. ValueError if malformed."""
    total = 0
    for part in spec.split(","):
        match = FRAMES.match(part)
        if not match:
            raise ValueError(f"{part.strip()!r} is not a frame or a range like 1-240")
        first, last = int(match[1]), int(match[2] or match[1])
        if last < first:
            raise ValueError(f"the range {first}-{last} runs backwards")
        total += last - first + 1
    if total > MAX_FRAMES:
        raise ValueError(f"at most {MAX_FRAMES:,} frames per job")
    return total


def create_render_job(*, renter: AbstractBaseUser, frames: str) -> RenderJob:
    job = RenderJob.objects.create(renter=renter, frames=frames.strip(), frame_count=parse_frames(frames))
    transaction.on_commit(_schedule_soon)
    return job


def _schedule_soon() -> None:
    from rentals.tasks import schedule_render_jobs_task

    enqueue(schedule_render_jobs_task.delay, "schedule_render_jobs")


def schedule_render_jobs(*, now: datetime | None = None, limit: int = 100) -> int:
    """Place queued jobs, oldest first, while on-demand nodes are free; the rest wait."""
    now = now or timezone.now()
    requeue_lost_jobs(now=now)
    placed = 0
    for job_id in list(RenderJob.objects.filter(status=RenderStatus.QUEUED).values_list("pk", flat=True)[:limit]):
        node_id = pick_render_node(now=now)
        if node_id is None:
            break
        placed += claim_render_node(job_id=job_id, node_id=node_id, now=now)
    return placed


def claim_render_node(*, job_id: int, node_id: int, now: datetime) -> bool:
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        job = RenderJob.objects.select_for_update().get(pk=job_id)
        if job.status != RenderStatus.QUEUED or not may_run_render(node, now=now):
            return False
        job.status, job.node, job.assigned_at = RenderStatus.ASSIGNED, node, now
        job.attempts += 1
        job.save(update_fields=["status", "node", "assigned_at", "attempts"])
        events.record(node_id=node.pk, kind="render_assigned", at=now, job_id=job.pk, frames=job.frames)
        if Worker.objects.filter(node=node, status__in=SERVING_WORKER_STATUSES).exists():
            # Like a rental: inference drains first; run_render follows the stop.
            start_node_drain(node=node, trigger=ReclaimTrigger.RENTAL_START, now=now)
        else:
            start_waiting_renders(node=node, now=now)
    return True


def start_waiting_renders(*, node: Node, now: datetime) -> int:
    """Send run_render for a locked node's assigned job once no worker of it is live."""
    if Worker.objects.filter(node=node, status__in=LIVE_WORKER_STATUSES).exists():
        return 0
    jobs = list(RenderJob.objects.select_for_update().filter(node=node, status=RenderStatus.ASSIGNED))
    for job in jobs:
        issue_command(node_id=node.pk, kind=CommandKind.RUN_RENDER, payload={"job_id": job.pk, "frames": job.frames})
        job.status, job.started_at = RenderStatus.RUNNING, now
        job.save(update_fields=["status", "started_at"])
    return len(jobs)


def finish_render_job(*, node: Node, job_id: Any, ok: bool, detail: str, now: datetime | None = None) -> None:
    """The agent's ack of run_render: done or failed; the node is free for work again."""
    now = now or timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        job = RenderJob.objects.select_for_update().filter(pk=job_id, node=node, status__in=ACTIVE_RENDER_STATUSES).first()
        if job is None:
            return
        job.status = RenderStatus.DONE if ok else RenderStatus.FAILED
        job.finished_at, job.detail = now, detail[:500]
        job.save(update_fields=["status", "finished_at", "detail"])
        events.record(node_id=node.pk, kind=f"render_{job.status}", at=now, job_id=job.pk)
        place_worker(node, now=now)
    transaction.on_commit(_schedule_soon)


def requeue_lost_jobs(*, now: datetime) -> int:
    """A job whose node went offline goes back to the queue (at most three tries)."""
    offline_before = now - timedelta(seconds=settings.NODE_OFFLINE_S)
    lost = RenderJob.objects.filter(status__in=ACTIVE_RENDER_STATUSES, node__last_seen_at__lt=offline_before)
    requeued = lost.filter(attempts__lt=3).update(status=RenderStatus.QUEUED, node=None, assigned_at=None, started_at=None)
    lost.update(status=RenderStatus.FAILED, finished_at=now, detail="its node went offline three times")
    return requeued
