"""Enqueue a follow-up task without letting a broker outage fail what already committed (R8).

Every task enqueued after a commit (a drain's finish, a replacement, a rescore,
a render schedule) has a periodic backstop in beat: the drain tick, recovery,
the reputation and render ticks. So when the broker cannot take the message,
the transition stands, the request answers as usual, and the backstop carries
the follow-up out once the broker is back. Without this, the exception raised
in an on_commit callback turned a committed pause into a 500.
"""

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction

log = logging.getLogger("marketplace.enqueue")


def enqueue(send: Callable[[], Any], what: str) -> bool:
    """Call `send` (a task's delay/apply_async); on a broker error log it and return False."""
    try:
        send()
    except Exception as exc:  # kombu's OperationalError, redis errors, a full disk: all the same here
        log.warning("enqueue_failed task=%s error=%s; the periodic backstop will carry it out", what, exc)
        return False
    return True


def enqueue_on_commit(send: Callable[[], Any], what: str) -> None:
    """`transaction.on_commit` for an enqueue: a broker outage is logged, never raised."""
    transaction.on_commit(lambda: enqueue(send, what))
