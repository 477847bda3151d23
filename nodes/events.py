import logging
from datetime import datetime
from typing import Any

from django.utils import timezone

from nodes.models import NodeEvent

log = logging.getLogger("nodes.events")


def record(
    *,
    node_id: int,
    kind: str,
    reclaim_id: int | None = None,
    worker_id: Any = None,
    at: datetime | None = None,
    **data: Any,
) -> NodeEvent:
    event = NodeEvent.objects.create(
        node_id=node_id,
        kind=kind,
        reclaim_id=reclaim_id,
        worker_id=worker_id,
        at=at or timezone.now(),
        data={k: (str(v) if isinstance(v, datetime) else v) for k, v in data.items()},
    )
    # One log line per transition, with the ids an operator greps for (JSON with LOG_FORMAT=json).
    ids = {"node_id": node_id, "worker_id": str(worker_id) if worker_id else None, "reclaim_id": reclaim_id}
    log.info("%s node=%s worker=%s reclaim=%s %s", kind, node_id, ids["worker_id"], reclaim_id, event.data, extra={"event": kind, **ids, "data": event.data})
    return event
