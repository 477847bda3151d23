from typing import Any

from celery import shared_task

from rentals import services


@shared_task(ignore_result=True)
def rental_tick() -> dict[str, Any]:
    return services.carry_out_due_rentals()
