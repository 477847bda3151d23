from datetime import datetime
from typing import Any

from django.utils import timezone

from nodes.models import NodeEvent


def record(
    *,
    node_id: int,
    kind: str,
    reclaim_id: int | None = None,
    worker_id: Any = None,
    at: datetime | None = None,
    **data: Any,
) -> NodeEvent:
    return NodeEvent.objects.create(
        node_id=node_id,
        kind=kind,
        reclaim_id=reclaim_id,
        worker_id=worker_id,
        at=at or timezone.now(),
        data={k: (str(v) if isinstance(v, datetime) else v) for k, v in data.items()},
    )
