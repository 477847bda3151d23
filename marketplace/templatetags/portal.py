"""Small formatting helpers for the portal's templates: clocks, countdowns and domain words."""

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

register = template.Library()

STATE_LABELS = {
    "available": "Available",
    "paused": "Paused",
    "draining": "Draining",
    "rented": "Rented",
    "offline": "Offline",
}

TRIGGER_LABELS = {
    "owner_pause": "Owner paused the node",
    "preemption": "Cloud preemption notice",
    "recovery": "Recovery found workload on a paused node",
    "late_registration": "A worker registered on a paused node",
    "rental_start": "A rental started (inference made room)",
}

END_REASON_LABELS = {
    "renter": "Ended by you",
    "term": "Term ran out",
    "provider": "Ended by the provider",
    "spot_reclaim": "Spot reclaim: the owner took the node back",
    "node_lost": "The node was lost",
}


@register.filter
def state_label(state: str) -> str:
    return STATE_LABELS.get(state, state.title())


@register.filter
def trigger_label(trigger: str) -> str:
    return TRIGGER_LABELS.get(trigger, trigger.replace("_", " "))


@register.filter
def end_reason_label(reason: str) -> str:
    return END_REASON_LABELS.get(reason, reason.replace("_", " ") or "—")


def seconds_until(when: datetime | None, now: datetime | None = None) -> int:
    if when is None:
        return 0
    return max(0, int((when - (now or timezone.now())).total_seconds() + 0.999))


def mmss(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


@register.filter
def countdown(when: datetime | None) -> str:
    """m:ss left until `when`, 0:00 once it has passed (the page's script keeps it ticking)."""
    return mmss(seconds_until(when))


@register.filter
def clock(when: datetime | None) -> str:
    """14:02:10 UTC; the date too when it is not today."""
    if when is None:
        return "—"
    when = timezone.localtime(when)
    today = timezone.localtime(timezone.now()).date()
    if when.date() == today:
        return when.strftime("%H:%M:%S %Z")
    return when.strftime("%Y-%m-%d %H:%M:%S %Z")


@register.filter
def offset(when: datetime | None, start: datetime | None) -> str:
    """+m:ss from the start of a drain, for its timeline."""
    if when is None or start is None:
        return ""
    return "+" + mmss((when - start).total_seconds())


@register.filter
def duration(seconds: float | None) -> str:
    return "—" if seconds is None else mmss(seconds)


@register.filter
def short_id(value: Any) -> str:
    return str(value)[:8]


def plural(n: Any, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# Events written in the same instant read in cause-and-effect order.
TIMELINE_ORDER = {"workload_disabled": 0, "drain_started": 1, "worker_draining": 2, "rental_noticed": 3}


@register.filter
def timeline(reclaim: Any) -> list:
    """A reclaim's events (prefetched) by time, causes before effects."""
    return sorted(reclaim.events.all(), key=lambda e: (e.at, TIMELINE_ORDER.get(e.kind, 9), e.pk))


@register.filter
def event_text(event: Any) -> str:
    """One line of a reclaim's timeline, in the owner's words."""
    d = event.data or {}
    kind = event.kind
    worker = f"worker {str(event.worker_id)[:8]}" if event.worker_id else "a worker"
    if kind == "drain_started":
        return f"Drain started: {plural(d.get('workers', 0), 'worker')}, {plural(d.get('in_flight', 0), 'request')} in flight"
    if kind == "workload_disabled":
        return "Workload off: no new requests reach this node"
    if kind == "worker_draining":
        return f"{worker.capitalize()} draining with {plural(d.get('in_flight', 0), 'request')} in flight"
    if kind == "worker_stopped":
        reason = d.get("reason")
        if reason == "drained":
            return f"{worker.capitalize()} stopped after its last request finished"
        if reason == "ceiling":
            return f"{worker.capitalize()} stopped at the deadline: {plural(d.get('cut', 0), 'request')} cut"
        return f"{worker.capitalize()} stopped ({reason})"
    if kind == "rental_noticed":
        return f"Rental #{d.get('rental_id')} given notice: ends at {d.get('reclaim_at', '')[11:19]} UTC"
    if kind == "rental_reclaim_cancelled":
        return f"Rental #{d.get('rental_id')} keeps running: the owner made the node available again"
    if kind == "rental_ended":
        return f"Rental #{d.get('rental_id')} ended ({END_REASON_LABELS.get(d.get('reason', ''), d.get('reason'))})"
    if kind == "reclaim_finished":
        return "Reclaim finished: the node is free"
    if kind == "stop_worker_acked":
        interrupted = d.get("interrupted")
        tail = f", {plural(interrupted, 'stream')} ended as interrupted" if interrupted else ""
        return f"Agent confirmed {worker} stopped{tail}"
    if kind.endswith("_acked"):
        return f"Agent acknowledged {kind[:-6].replace('_', ' ')}"
    return kind.replace("_", " ").capitalize()


@register.filter
def get_item(mapping: dict, key: Any) -> Any:
    return mapping.get(key) if mapping else None
