"""`python -m bench [name ...]`: run the benchmarks in turn and print one report.

A benchmark that fails is reported as such and the others still run; the
exit status is then 1. Figures are printed, never asserted.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from datetime import UTC, datetime

BENCHMARKS = ["heartbeats", "drain_reaction", "deadline", "reputation", "router", "demo_start", "pages", "preemption"]


def main(argv: list[str]) -> int:
    names = argv or BENCHMARKS
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {BENCHMARKS}", file=sys.stderr)
        return 2
    from bench import bench_broker_url, bench_database_url

    started = time.monotonic()
    print(
        f"# Benchmarks {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {bench_database_url()} and {bench_broker_url()}",
        flush=True,
    )
    reports, failed = [], []
    for name in names:
        print(f"... {name}", file=sys.stderr, flush=True)
        try:
            report = importlib.import_module(f"bench.{name}").run()
        except Exception:
            failed.append(name)
            report = f"== {name}: FAILED ==\n{traceback.format_exc()}"
        reports.append(report)
        print(f"\n{report}", flush=True)
    print(f"\n# {len(names) - len(failed)}/{len(names)} benchmarks ran in {time.monotonic() - started:.0f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
