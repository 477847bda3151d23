"""`make soak` in miniature, so the soak (outside the normal suite) cannot rot unnoticed.

The same program as the 10-minute soak: real web, Celery worker and beat, model
servers and the swarm of simulated nodes, streams and random pauses; here 30
nodes, 6 streams and 15 seconds. It must end with every invariant held.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.stack import drop_database, with_database_name
from tests.e2e.conftest import e2e_broker_url

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]
ROOT = Path(__file__).resolve().parents[2]


def test_soak_in_miniature_holds_every_invariant() -> None:
    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith(("postgres://", "postgresql://")):
        pytest.skip("the soak needs PostgreSQL")
    database = with_database_name(base, f"marketplace_bench_soak_{secrets.token_hex(4)}")
    env = {**os.environ, "SOAK_DATABASE_URL": database, "SOAK_REDIS_URL": e2e_broker_url()}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("CELERY_TASK_ALWAYS_EAGER", None)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "bench.soak", "--nodes", "30", "--streams", "6", "--minutes", "0.25", "--ramp-s", "3"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )
    finally:
        drop_database(database)
    report = run.stdout[run.stdout.find("== soak =="):]
    assert run.returncode == 0, f"{report or run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "all invariants held" in report
    lines = {line.split("  ", 1)[0]: line for line in report.splitlines()}
    assert "0 rows, in_flight 0" in lines["leaked slots after hang-up"]
    assert lines["false lost workers"].split()[3] == "0"
    pauses = int(lines["pauses (owner API)"].split()[3])
    requests = int(lines["requests"].split()[1].replace(",", ""))
    assert pauses > 0 and requests > 0, report
