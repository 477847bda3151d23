"""`python -m bench [name ...]`: run the benchmarks in turn, print one report and write BENCHMARKS.md.

A benchmark that fails is reported as such and the others still run; the
exit status is then 1. Figures are printed, never asserted.

BENCHMARKS.md (at the repository root; env BENCH_REPORT for another path, so
that tests and trial runs leave the real one alone) is written after every
run, whole or partial: the date, the exact command, the machine, a table of
every benchmark's headline figures (`bench.headline`) against its target,
then each benchmark's full text report, and a failed one as FAILED with the
last line of its traceback. A run of only some benchmarks (`python -m bench
reputation`) still writes it, says "partial run" in its header and names the
ones that ran: a trial run should set BENCH_REPORT.
"""

from __future__ import annotations

import importlib
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench import FIGURES, Figure

BENCHMARKS = ["heartbeats", "drain_reaction", "deadline", "reputation", "router", "demo_start", "pages", "preemption"]
ROOT = Path(__file__).resolve().parent.parent
# Above this 1-minute load average at the start, other work shares the machine: the figures are conservative.
BUSY_LOAD = 0.5


@dataclass
class Outcome:
    """One benchmark's run: its text report and headline figures, or the traceback it failed with."""

    name: str
    report: str = ""
    figures: list[Figure] = field(default_factory=list)
    error: str | None = None  # the formatted traceback of a failed run
    seconds: float = 0.0

    @property
    def failure(self) -> str:
        """The traceback's last line (the exception and its message)."""
        lines = [line for line in (self.error or "").splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""


def main(argv: list[str]) -> int:
    names = argv or BENCHMARKS
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {BENCHMARKS}", file=sys.stderr)
        return 2
    from bench import bench_broker_url, bench_database_url

    load_at_start = os.getloadavg()[0]
    began_at = datetime.now(UTC)
    started = time.monotonic()
    print(
        f"# Benchmarks {began_at:%Y-%m-%d %H:%M} UTC on {bench_database_url()} and {bench_broker_url()}",
        flush=True,
    )
    outcomes = []
    for name in names:
        print(f"... {name}", file=sys.stderr, flush=True)
        outcome = Outcome(name)
        first = len(FIGURES)
        t0 = time.monotonic()
        try:
            outcome.report = importlib.import_module(f"bench.{name}").run()
        except Exception:
            outcome.error = traceback.format_exc()
            outcome.report = f"== {name}: FAILED ==\n{outcome.error}"
        outcome.seconds = time.monotonic() - t0
        # What it recorded before failing was measured too: kept, under its FAILED heading.
        outcome.figures = FIGURES[first:]
        outcomes.append(outcome)
        print(f"\n{outcome.report}", flush=True)
    failed = [o.name for o in outcomes if o.error]
    elapsed = time.monotonic() - started
    print(f"\n# {len(names) - len(failed)}/{len(names)} benchmarks ran in {elapsed:.0f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))

    path = report_path()
    text = render(
        outcomes,
        began_at=began_at,
        seconds=elapsed,
        command=command_line(argv),
        machine=machine(bench_database_url(), bench_broker_url(), load_at_start),
        load_at_start=load_at_start,
    )
    path.write_text(text)
    print(f"# wrote {path}", flush=True)
    return 1 if failed else 0


def report_path() -> Path:
    return Path(os.environ.get("BENCH_REPORT") or ROOT / "BENCHMARKS.md")


def command_line(argv: Sequence[str]) -> str:
    """`python -m bench ...` as run, preceded by the BENCH_* environment it ran with (passwords masked)."""
    settings = [
        f"{key}={shlex.quote(_mask(value))}" for key, value in sorted(os.environ.items()) if key.startswith("BENCH_")
    ]
    return " ".join([*settings, "python -m bench", *(shlex.quote(a) for a in argv)])


def _mask(value: str) -> str:
    # postgres://user:secret@host/db -> postgres://user:***@host/db: the report is meant to be committed.
    return re.sub(r"(://[^:/@\s]*):[^@/\s]+@", r"\1:***@", value)


# --- the machine ------------------------------------------------------------------------


def machine(database_url: str, redis_url: str, load_at_start: float) -> list[tuple[str, str]]:
    """(label, value) pairs describing where the figures were measured; a part that cannot be read says so."""
    return [
        ("CPU", _cpu_model()),
        ("cores", f"{os.cpu_count()} (logical CPUs)"),
        ("RAM", _ram()),
        ("OS", f"{_os_name()}, kernel {platform.release()} ({platform.machine()})"),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("PostgreSQL", _postgres_version(database_url)),
        ("Redis", _redis_version(redis_url)),
        ("load average at start", f"{load_at_start:.2f} (1 min)"),
        ("code", _git_revision()),
    ]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024**2:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return "unknown"


def _os_name() -> str:
    try:
        fields = dict(
            line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line
        )
    except OSError:
        return platform.system()
    return fields.get("PRETTY_NAME", fields.get("NAME", platform.system())).strip().strip('"')


def _postgres_version(database_url: str) -> str:
    import psycopg

    from simulator.stack import libpq_url, with_database_name

    # The bench database, as asked; a partial run may not have made it yet: then the server's own.
    for url in (database_url, with_database_name(database_url, "postgres")):
        try:
            with psycopg.connect(libpq_url(url), connect_timeout=5) as conn:
                row = conn.execute("SHOW server_version").fetchone()
            return str(row[0]) if row else "unknown"
        except psycopg.Error as exc:
            error = exc
    return f"unknown (not reachable: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__})"


def _redis_version(redis_url: str) -> str:
    import redis

    try:
        client = redis.Redis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=5)
        try:
            return str(client.info("server").get("redis_version", "unknown"))
        finally:
            client.close()
    except redis.RedisError as exc:
        return f"unknown (not reachable: {exc})"


def _git_revision() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True, timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return f"commit {head.stdout.strip()}" + (" with uncommitted changes" if dirty.stdout.strip() else "")


# --- the Markdown -----------------------------------------------------------------------


def render(
    outcomes: Sequence[Outcome],
    *,
    began_at: datetime,
    seconds: float,
    command: str,
    machine: Sequence[tuple[str, str]],
    load_at_start: float,
) -> str:
    """BENCHMARKS.md: header, machine, summary table of every figure, then each benchmark's full report."""
    ran = [o.name for o in outcomes]
    failed = [o.name for o in outcomes if o.error]
    partial = [n for n in BENCHMARKS if n not in ran]
    out = ["# Benchmarks", ""]
    if partial:
        out += [
            (f"**Partial run**: only {', '.join(f'`{n}`' for n in ran)} ran; not run: {', '.join(f'`{n}`' for n in partial)}. "
             "`make bench` runs them all."),
            "",
        ]
    out += [
        f"Measured on {began_at:%Y-%m-%d %H:%M} UTC; {len(ran) - len(failed)}/{len(ran)} benchmarks completed in {seconds:,.0f} s"
        + (f"; FAILED: {', '.join(failed)}" if failed else "") + ".",
        "",
        f"Command: `{command}`",
        "",
        ("Written by `make bench` (`python -m bench`, see `bench/__main__.py`). Each benchmark runs real processes "
         "(uvicorn, Celery, PostgreSQL, Redis) on this machine and prints its figures; nothing is asserted. Every "
         "process shares the machine's cores, so load generator and server compete for them."),
        "",
        "## Machine",
        "",
    ]
    out += [f"- **{label}**: {value}" for label, value in machine]
    if load_at_start > BUSY_LOAD:
        out += [
            "",
            (f"> Note: the load average was {load_at_start:.2f} when the run began (above {BUSY_LOAD:g}): other work "
             "was using the machine, so these figures are conservative."),
        ]
    out += ["", "## Summary", "", "| benchmark | figure | value | target | met? |", "|---|---|---|---|---|"]
    for o in outcomes:
        out += [_row(o.name, f.what, f.value_text(), f.target, _verdict(f)) for f in o.figures]
        if o.error:
            out.append(_row(o.name, "benchmark failed", o.failure, "", "FAILED"))
        elif not o.figures:
            out.append(_row(o.name, "no headline figure recorded (see its report)", "", "", ""))
    missed = [f for o in outcomes for f in o.figures if f.met is False]
    verdict = (
        f"{len(missed)} figure(s) MISSED their target: " + "; ".join(f"{f.benchmark}: {f.what}" for f in missed) + "."
        if missed else "Every figure judged against a target met it."
    )
    if failed:
        verdict += f" FAILED (their figures are missing): {', '.join(failed)}."
    out += ["", verdict]
    out += ["", "## Reports", ""]
    for o in outcomes:
        if o.error:
            out += [f"### {o.name}: FAILED", "", f"`{_escape(o.failure)}`", "", _fenced(o.error.rstrip()), ""]
        else:
            out += [f"### {o.name}", "", f"Ran in {o.seconds:,.0f} s.", "", _fenced(o.report.rstrip()), ""]
    return "\n".join(out).rstrip() + "\n"


def _verdict(f: Figure) -> str:
    if f.met is True:
        return "met"
    if f.met is False:
        return "MISSED"
    return "not judged" if f.target else ""


def _escape(text: str) -> str:
    return text.replace("`", "'")


def _row(*cells: str) -> str:
    # A table cell holds one line and no unescaped pipe.
    return "| " + " | ".join(" ".join(c.split()).replace("|", "\\|") for c in cells) + " |"


def _fenced(text: str) -> str:
    # A fence longer than any backtick run inside, so a report can never close it early.
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
