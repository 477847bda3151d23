"""Celery tasks: fetch by id, call one service, hold no rules. All safe to run twice."""

from typing import Any

from celery import shared_task

from nodes import drain, heartbeats, placement, recovery, slots


@shared_task(ignore_result=True)
def finish_drain_task(worker_id: str) -> bool:
    return drain.finish_drain(worker_id)


@shared_task(ignore_result=True)
def place_replacement_task(model_id: int, instead_of_node_id: int) -> str | None:
    worker = placement.place_replacement(model_id=model_id, instead_of_node_id=instead_of_node_id)
    return str(worker.pk) if worker else None


@shared_task(ignore_result=True)
def drain_tick() -> int:
    return recovery.drain_tick()


@shared_task(ignore_result=True)
def heartbeat_guard() -> dict[str, Any]:
    released = slots.release_dead_router_slots()
    report = heartbeats.expire_workers()
    report["slots_released"] = released
    return report


@shared_task(ignore_result=True)
def recovery_task() -> dict[str, Any]:
    return recovery.run_recovery()

