from typing import Any

from celery import shared_task

from reputation import services


@shared_task(ignore_result=True)
def rescore_node_task(node_id: int) -> None:
    services.rescore_node(node_id=node_id)


@shared_task(ignore_result=True)
def recompute_reputation() -> dict[str, Any]:
    return services.recompute_all()
