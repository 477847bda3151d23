from typing import Any

from celery import shared_task

from rentals import render, services


@shared_task(ignore_result=True)
def rental_tick() -> dict[str, Any]:
    return services.carry_out_due_rentals()


@shared_task(ignore_result=True)
def schedule_render_jobs_task() -> int:
    return render.schedule_render_jobs()
