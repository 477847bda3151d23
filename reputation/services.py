"""Scores recomputed in set-based SQL, and the delisting rule with its audit rows (R11)."""

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.utils import timezone

from reputation.models import ProviderReputation, Standing, StandingChange
from reputation.scoring import FAILURE_REASONS, SUCCESS_REASONS

log = logging.getLogger(__name__)

# One pass over the rentals ended in the window, grouped by node (or provider);
# the same statement serves the nightly full recompute and the single-node
# update after a rental ends. Portable between PostgreSQL and SQLite.
_COUNTS = """
    SUM(CASE WHEN r.id IS NOT NULL AND NOT r.is_spot AND r.end_reason IN ({ok}) THEN 1 ELSE 0 END) AS successes,
    SUM(CASE WHEN r.id IS NOT NULL AND NOT r.is_spot AND r.end_reason IN ({bad}) THEN 1 ELSE 0 END) AS failures,
    SUM(CASE WHEN r.id IS NOT NULL AND r.is_spot THEN 1 ELSE 0 END) AS spot_left_out
""".format(
    ok=", ".join(f"'{r}'" for r in SUCCESS_REASONS), bad=", ".join(f"'{r}'" for r in FAILURE_REASONS)
)

def _score_upsert(*, table: str, key: str, key_expr: str, extra: dict[str, str] | None = None) -> str:
    """The score statement for one table: counts grouped by `key_expr` (a node or
    its provider), upserted on `key`; `extra` are columns set only on insert."""
    extra = extra or {}
    insert_cols = ", ".join([key, "successes", "failures", "spot_left_out", "score", "updated_at", *extra])
    insert_vals = ", ".join(["", *extra.values()])
    return f"""
INSERT INTO {table} ({insert_cols})
SELECT {key}, successes, failures, spot_left_out,
       (successes + %(a)s) * 1.0 / (successes + failures + %(a)s + %(b)s), %(now)s{insert_vals}
FROM (
    SELECT {key_expr} AS {key}, {_COUNTS}
    FROM nodes_node n
    LEFT JOIN rentals_rental r ON r.node_id = n.id AND r.status = 'ended' AND r.ended_at >= %(since)s
    WHERE {{where}}
    GROUP BY {key_expr}
) counts
WHERE true
ON CONFLICT ({key}) DO UPDATE SET
    successes = excluded.successes, failures = excluded.failures, spot_left_out = excluded.spot_left_out,
    score = excluded.score, updated_at = excluded.updated_at
"""


NODE_SQL = _score_upsert(table="reputation_nodereputation", key="node_id", key_expr="n.id")
PROVIDER_SQL = _score_upsert(
    table="reputation_providerreputation", key="provider_id", key_expr="n.provider_id", extra={"standing": "'listed'"}
)


def _params(now: datetime) -> dict[str, Any]:
    return {
        "a": settings.REPUTATION_PRIOR_SUCCESSES,
        "b": settings.REPUTATION_PRIOR_FAILURES,
        "now": now,
        "since": now - timedelta(days=settings.REPUTATION_WINDOW_DAYS),
    }


def recompute_all(*, now: datetime | None = None) -> dict[str, int]:
    """Every node's and provider's score from scratch: two statements, no per-rental loop."""
    now = now or timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(NODE_SQL.format(where="true"), _params(now))
        nodes = cursor.rowcount
        cursor.execute(PROVIDER_SQL.format(where="true"), _params(now))
        providers = cursor.rowcount
    delisted = apply_delisting(now=now)
    return {"nodes": nodes, "providers": providers, "delisted": delisted}


def rescore_node(*, node_id: int, now: datetime | None = None) -> None:
    """After a rental ends: the same statements, for its node and its provider only."""
    now = now or timezone.now()
    params = {**_params(now), "node": node_id}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(NODE_SQL.format(where="n.id = %(node)s"), params)
        cursor.execute(
            PROVIDER_SQL.format(where="n.provider_id = (SELECT provider_id FROM nodes_node WHERE id = %(node)s)"), params
        )
    apply_delisting(now=now)


DELIST_SQL = """
UPDATE reputation_providerreputation SET standing = 'delisted'
WHERE standing = 'listed' AND successes + failures >= %(minimum)s AND score < %(threshold)s
  AND (reinstated_at IS NULL OR EXISTS (
      SELECT 1 FROM rentals_rental r JOIN nodes_node n ON n.id = r.node_id
      WHERE n.provider_id = reputation_providerreputation.provider_id AND NOT r.is_spot
        AND r.end_reason IN ({bad}) AND r.ended_at > reputation_providerreputation.reinstated_at))
RETURNING provider_id, score, successes + failures
""".format(bad=", ".join(f"'{r}'" for r in FAILURE_REASONS))


def apply_delisting(*, now: datetime | None = None) -> int:
    """Delist, in one statement, providers below the threshold with enough counted
    rentals; a reinstated provider stays listed until a new counted failure."""
    now = now or timezone.now()
    threshold, minimum = settings.REPUTATION_DELIST_BELOW, settings.REPUTATION_DELIST_MIN_RENTALS
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(DELIST_SQL, {"minimum": minimum, "threshold": threshold})
        delisted = cursor.fetchall()
        StandingChange.objects.bulk_create(
            StandingChange(
                provider_id=provider_id, standing=Standing.DELISTED, changed_by=None, score=score, at=now,
                reason=f"score {score:.2f} below {threshold:.2f} over {counted} counted rentals",
            )
            for provider_id, score, counted in delisted
        )
    if delisted:
        log.warning("providers_delisted count=%d ids=%s", len(delisted), [row[0] for row in delisted[:20]])
    return len(delisted)


def set_standing(
    *, provider_id: int, standing: str, by: AbstractBaseUser | None, reason: str, now: datetime | None = None
) -> bool:
    """Delist or reinstate, recorded with who and why. False when nothing changed."""
    now = now or timezone.now()
    with transaction.atomic():
        rep = ProviderReputation.objects.select_for_update().filter(provider_id=provider_id).first()
        if rep is None:
            from reputation.scoring import smoothed

            rep = ProviderReputation.objects.create(provider_id=provider_id, score=smoothed(0, 0))
        if rep.standing == standing:
            return False
        rep.standing = standing
        fields = ["standing"]
        if standing == Standing.LISTED:
            rep.reinstated_at = now
            fields.append("reinstated_at")
        rep.save(update_fields=fields)
        StandingChange.objects.create(
            provider_id=provider_id, standing=standing, changed_by=by, reason=reason[:500], score=rep.score, at=now
        )
    log.warning("provider_standing provider=%s standing=%s by=%s reason=%s", provider_id, standing, getattr(by, "pk", None), reason)
    return True
