"""Benchmarks: real processes on PostgreSQL and Redis; they print figures and never assert timings.

`python -m bench` (what `make bench` runs) runs them all; `python -m bench
heartbeats drain_reaction` runs some. Each benchmark drops and recreates its
database, so runs are repeatable, and stops every process it started.

Each benchmark's `run()` returns its text report and records its headline
figures with `headline(...)` (a `Figure`: value, target, met or not);
`python -m bench` gathers them into BENCHMARKS.md.

The bench process sets Django up itself (`setup_django`), on the same database
and broker as the processes it starts, so it can create data and trigger
transitions through the real services (nodes.services, nodes.slots, ...),
exactly as the web and Celery processes would.

Environment:
  BENCH_DATABASE_URL  used as is (its database is dropped and recreated!)
  DATABASE_URL        otherwise its PostgreSQL server, database `marketplace_bench`
  BENCH_REDIS_URL, TEST_REDIS_URL   the broker (default redis://127.0.0.1:6379/14)
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.stack import create_database, database_name, with_database_name

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/marketplace_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/14"
# Env for every process a benchmark starts: production-like request handling
# (no per-query debug capture) and router leases that never expire on their
# own (the benchmarks hold slots on purpose, longer than ROUTER_EXPIRY_S).
# Production-like processes (DEBUG=false needs a real SECRET_KEY; this one only ever meets bench data).
BENCH_SECRET_KEY = "bench-only-secret-key-0123456789abcdefghijklmnopqrstuvwxyz-ABCDEFG"
CHILD_ENV = {"DEBUG": "false", "SECRET_KEY": BENCH_SECRET_KEY, "ROUTER_EXPIRY_S": "3600", "LOG_LEVEL": "WARNING"}


def log_dir(name: str) -> Path:
    """Where a benchmark's processes log: one folder per run of a benchmark, emptied at its start."""
    path = Path(tempfile.gettempdir()) / "marketplace-bench-logs" / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def bench_database_url() -> str:
    explicit = os.environ.get("BENCH_DATABASE_URL")
    if explicit:
        url = explicit
    else:
        base = os.environ.get("DATABASE_URL", "")
        # Never the developer's own database: same server, the bench's name.
        url = with_database_name(base, "marketplace_bench") if base.startswith(("postgres://", "postgresql://")) else DEFAULT_DATABASE_URL
    if "bench" not in database_name(url):
        raise SystemExit(f"refusing to drop {database_name(url)!r}: a bench database name must contain 'bench'")
    return url


def bench_broker_url() -> str:
    return os.environ.get("BENCH_REDIS_URL") or os.environ.get("TEST_REDIS_URL") or DEFAULT_REDIS_URL


_django_ready = False


def setup_django() -> None:
    """Configures Django in this process on the bench database and broker (once)."""
    global _django_ready
    if _django_ready:
        return
    # Before settings are imported: they read the environment once.
    os.environ["DATABASE_URL"] = bench_database_url()
    os.environ["CELERY_BROKER_URL"] = bench_broker_url()
    os.environ["DJANGO_SETTINGS_MODULE"] = "marketplace.settings"
    os.environ.setdefault("DEBUG", "false")
    os.environ.setdefault("SECRET_KEY", BENCH_SECRET_KEY)
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.pop("CELERY_TASK_ALWAYS_EAGER", None)
    # DEBUG=false and no collectstatic: WhiteNoise warns about a missing STATIC_ROOT it never needs here.
    warnings.filterwarnings("ignore", message="No directory at", category=UserWarning)
    import django

    django.setup()
    import marketplace.celery  # noqa: F401  - the project's Celery app, so .delay() goes to Redis

    _django_ready = True


def fresh_database() -> str:
    """Drops and recreates the bench database and migrates it; returns its URL."""
    setup_django()
    from django.core.management import call_command
    from django.db import connections

    connections.close_all()  # our own sessions would block nothing (FORCE), but would then be dead
    for conn in connections.all():
        if getattr(conn, "pool", None) is not None:
            conn.close_pool()  # pooled sessions too: a fresh pool opens on the new database
    url = bench_database_url()
    create_database(url, drop_existing=True)
    call_command("migrate", verbosity=0, interactive=False)
    return url


def provider_and_model() -> tuple[Any, Any]:
    """A provider account and the served model every bench worker runs."""
    from django.contrib.auth import get_user_model

    from nodes.models import ServedModel

    user, _ = get_user_model().objects.get_or_create(username="bench-provider")
    model, _ = ServedModel.objects.get_or_create(
        name="llama-3-8b", defaults={"min_vram_gb": 16, "target_replicas": 1_000_000, "max_slots": 8}
    )
    return user, model


def nodes_with_a_held_slot(count: int, *, tag: str) -> list[tuple[int, str, str]]:
    """`count` online spot nodes whose one ready worker holds one router slot; (node id, worker id, slot id).

    The slots belong to a router instance whose last beat is a day ahead, so
    the heartbeat guard never releases them: only the bench (or a deadline) does.
    """
    from datetime import timedelta

    from django.utils import timezone

    from nodes.heartbeats import register_worker
    from nodes.services import create_node
    from nodes.slots import acquire_slot, router_heartbeat

    provider, model = provider_and_model()
    router = f"bench-router-{tag}"
    router_heartbeat(instance_id=router, now=timezone.now() + timedelta(days=1))
    held = []
    for i in range(count):
        node, _ = create_node(provider=provider, name=f"{tag}-{i}", is_spot=True, gpu_model="A100", vram_gb=80)
        worker = register_worker(node=node, model=model.name, endpoint=f"http://10.1.{i // 250}.{i % 250}:8000", max_slots=8)
        slot = acquire_slot(worker_id=worker.pk, router_instance=router, request_id=f"{tag}-{i}")
        if slot is None:
            raise RuntimeError(f"a fresh ready worker refused a slot (worker {worker.pk})")
        held.append((node.pk, str(worker.pk), str(slot.pk)))
    return held


# --- figures -------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One headline figure of a benchmark, as BENCHMARKS.md lists it.

    `target` is the target's text ("p99 < 100 ms"), empty for a figure shown
    for context only; `met` is None when nothing is judged (no target, or the
    figure could not be measured).
    """

    benchmark: str
    what: str
    value: float | str
    unit: str = ""
    target: str = ""
    met: bool | None = None

    def value_text(self) -> str:
        text = _fmt(self.value)
        if not self.unit or isinstance(self.value, str):
            return text
        return f"{text}{self.unit}" if self.unit in ("x", "%") else f"{text} {self.unit}"


# Every figure recorded in this process, in order; `python -m bench` takes each
# benchmark's share after its run() returns (a module-level list, so run() keeps
# returning just its text report and `python -m bench.NAME` still works).
FIGURES: list[Figure] = []


def headline(
    benchmark: str, what: str, value: float | str, unit: str = "", *, target: str = "", met: bool | None = None
) -> Figure:
    """Records a headline figure of `benchmark` for BENCHMARKS.md; returns it."""
    figure = Figure(benchmark, what, value, unit, target, met)
    FIGURES.append(figure)
    return figure


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


def table(title: str, header: Sequence[str], rows: Iterable[Sequence[Any]], notes: Iterable[str] = ()) -> str:
    """A plain fixed-width table with a title and notes under it."""
    cells = [[str(c) for c in header]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    out = [f"== {title} ==", "  ".join(c.ljust(w) for c, w in zip(cells[0], widths)), line]
    out += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in cells[1:]]
    out += [f"  {note}" for note in notes]
    return "\n".join(out)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
