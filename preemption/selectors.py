"""The interruption log per capacity pool (cloud, instance type, zone), read from Reclaims.

Interruptions: every Reclaim but a rental's start (a Pause, a cloud's notice,
recovery, a late registration), plus what shadow mode recorded (the cloud took
the machine whether or not we drained it).

Spot node-hours observed: for each spot node of the pool, from its listing
(Node.created_at) to its last heartbeat (Node.last_seen_at); a node never
heard from adds nothing. Gaps while a node was offline are counted too, so
the hours are an upper bound and MTBI errs long on pools of flaky nodes.
MTBI = spot node-hours / interruptions, null until the first interruption.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from nodes.models import Node, Reclaim, ReclaimTrigger
from preemption.models import OnDemandPrice, ShadowReclaim

DAYS = 30

PoolKey = tuple[str, str, str]


@dataclass
class PoolStats:
    cloud: str
    instance_type: str
    zone: str
    nodes: int = 0
    spot_nodes: int = 0
    spot_node_hours: float = 0.0
    interruptions: int = 0
    interruptions_30d: int = 0
    shadow_interruptions: int = 0
    drains_clean: int = 0
    requests_cut: int = 0
    at_risk_nodes: int = 0
    spot_price_per_hour: float | None = None
    on_demand_price_per_hour: float | None = None
    daily: list[tuple[date, int]] = field(default_factory=list)

    @property
    def key(self) -> PoolKey:
        return (self.cloud, self.instance_type, self.zone)

    @property
    def label(self) -> str:
        return " / ".join(p or "-" for p in self.key)

    @property
    def mtbi_hours(self) -> float | None:
        return self.spot_node_hours / self.interruptions if self.interruptions else None

    @property
    def at_risk(self) -> bool:
        return self.at_risk_nodes > 0

    @property
    def realised_discount(self) -> float | None:
        if not self.on_demand_price_per_hour or self.spot_price_per_hour is None:
            return None
        return 1 - self.spot_price_per_hour / self.on_demand_price_per_hour


def pool_stats(*, now: datetime | None = None, daily: bool = False) -> list[PoolStats]:
    """Every pool with a node in it, in a fixed number of queries whatever the fleet's size."""
    now = now or timezone.now()
    since = now - timedelta(days=DAYS)
    pools: dict[PoolKey, PoolStats] = {}

    def pool(key: PoolKey) -> PoolStats:
        if key not in pools:
            pools[key] = PoolStats(*key)
        return pools[key]

    spot_prices: dict[PoolKey, list[Decimal]] = defaultdict(list)
    for cloud, itype, zone, is_spot, created, seen, price, risk in Node.objects.values_list(
        "cloud", "instance_type", "zone", "is_spot", "created_at", "last_seen_at", "price_per_hour", "at_risk_until"
    ).iterator(chunk_size=2000):
        stats = pool((cloud, itype, zone))
        stats.nodes += 1
        if risk is not None and risk > now:
            stats.at_risk_nodes += 1
        if not is_spot:
            continue
        stats.spot_nodes += 1
        spot_prices[stats.key].append(price)
        if seen is not None and seen > created:
            stats.spot_node_hours += (min(seen, now) - created).total_seconds() / 3600

    pool_fields = ("node__cloud", "node__instance_type", "node__zone")
    interruptions = Reclaim.objects.exclude(trigger=ReclaimTrigger.RENTAL_START)
    for row in interruptions.values(*pool_fields).annotate(
        total=Count("id"),
        recent=Count("id", filter=Q(started_at__gte=since)),
        clean=Count("id", filter=Q(finished_at__isnull=False, cut=0)),
        cut_sum=Sum("cut"),
    ):
        stats = pool(_key(row))
        stats.interruptions += row["total"]
        stats.interruptions_30d += row["recent"]
        stats.drains_clean += row["clean"]
        stats.requests_cut += row["cut_sum"] or 0
    for row in ShadowReclaim.objects.values(*pool_fields).annotate(
        total=Count("id"), recent=Count("id", filter=Q(started_at__gte=since))
    ):
        stats = pool(_key(row))
        stats.shadow_interruptions += row["total"]
        stats.interruptions += row["total"]
        stats.interruptions_30d += row["recent"]

    prices = {(c, t): float(p) for c, t, p in OnDemandPrice.objects.values_list("cloud", "instance_type", "price_per_hour")}
    for key, stats in pools.items():
        if spot_prices[key]:
            stats.spot_price_per_hour = float(sum(spot_prices[key]) / len(spot_prices[key]))
        stats.on_demand_price_per_hour = prices.get((stats.cloud, stats.instance_type))

    if daily:
        days = [(now - timedelta(days=DAYS - 1 - i)).date() for i in range(DAYS)]
        counts: dict[PoolKey, dict[date, int]] = defaultdict(lambda: defaultdict(int))
        for queryset in (interruptions, ShadowReclaim.objects.all()):
            for row in (
                queryset.filter(started_at__gte=datetime.combine(days[0], datetime.min.time(), tzinfo=now.tzinfo))
                .annotate(day=TruncDate("started_at"))
                .values(*pool_fields, "day")
                .annotate(n=Count("id"))
            ):
                counts[_key(row)][row["day"]] += row["n"]
        for key, stats in pools.items():
            stats.daily = [(d, counts[key][d]) for d in days]
    return sorted(pools.values(), key=lambda s: s.key)


def find_pool(*, cloud: str, instance_type: str, zone: str, now: datetime | None = None) -> PoolStats | None:
    for stats in pool_stats(now=now):
        if stats.key == (cloud, instance_type, zone):
            return stats
    return None


def _key(row: dict) -> PoolKey:
    return (row["node__cloud"], row["node__instance_type"], row["node__zone"])
