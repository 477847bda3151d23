"""kombu's Redis transport with one guard, so a Celery worker survives a Redis outage (issue #8).

Set as CELERY_BROKER_TRANSPORT for redis:// and rediss:// brokers (settings.py); the URL,
transport options and behaviour are kombu's own (celery 5.7.0, kombu 5.7.0, redis-py 8.1.0:
the latest releases, none has a fix).

The fault it guards against: when the worker loses Redis, Celery's consumer cleans up the
dead connection in two steps (celery/worker/consumer/consumer.py,
`on_connection_error_after_connected`): `connection.collect()`, then `connection.close()`.

1. `collect()` (kombu/connection.py, `collect`): the Redis transport has no `_collect`, so it
   closes the default channel with the connection errors ignored. If the channel's BRPOP is
   in flight, `Channel.close()` (kombu/transport/redis.py, `close`) first reads its reply,
   `_brpop_read()` raises ConnectionError on the dead socket, and the channel is left *not
   closed*. `collect()` then cuts the transport loose: `transport.client = None`
   (kombu/connection.py, `_do_close_transport`).
2. `close()` closes that same channel again. This time it gets through: `_disconnect_pools()`
   drops the pool, and if any message is delivered but not acknowledged (an acks_late task
   running, a prefetched or ETA task waiting), `QoS.restore_unacked_once()` tries to put it
   back, which builds a new pool, `_connparams()` reads `self.connection.client.hostname`
   with `client` None: AttributeError. Only connection and channel errors are ignored there,
   so it reaches `Consumer.start`, which calls it unrecoverable, and the worker process exits
   ("Unrecoverable error: AttributeError(\"'NoneType' object has no attribute 'hostname'\")").
   A task that finishes after the loss hits the same line when it acks its message on the old
   channel (`QoS.ack` -> `_remove_from_indices` -> new pool -> `_connparams`).

The guard: a channel whose transport has been cut loose raises redis' ConnectionError from
`_connparams` instead. That is what the channel would raise a moment later anyway (the broker
is gone), and it is one of the transport's connection errors, which every caller on these
paths already handles: the cleanup ignores it and the consumer reconnects; the late ack is
logged ("Couldn't ack ...") and the message, still in Redis's unacked set, is delivered again
after the visibility timeout (the tasks are idempotent, acks are late). Nothing else changes:
a live channel never has `client` None.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            raise RedisConnectionError("the broker connection of this channel was closed (connection lost)")
        return super()._connparams(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):
    Channel = Channel
