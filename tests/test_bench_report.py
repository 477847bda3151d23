"""BENCHMARKS.md, the report `make bench` writes: rendered from fake figures and reports, no real benchmark runs."""

import sys
import types
from datetime import UTC, datetime

import pytest

import bench
from bench import Figure
from bench import __main__ as runner

MACHINE = [("CPU", "Fake CPU @ 1.00GHz"), ("cores", "2 (logical CPUs)"), ("RAM", "23.5 GiB"),
           ("OS", "Debian GNU/Linux 12 (bookworm)"), ("Python", "CPython 3.11.7"), ("PostgreSQL", "15.20"),
           ("Redis", "7.0.15")]


def outcomes() -> list[runner.Outcome]:
    return [
        runner.Outcome(
            "drain_reaction",
            report="== Drain reaction ==\nmeasure  p50 ms\ncommitted  32.90",
            figures=[
                Figure("drain_reaction", "stop command seen, p50", 32.9, "ms"),
                Figure("drain_reaction", "stop command seen, p99", 44.8, "ms", "p99 < 100 ms", True),
            ],
            seconds=12.0,
        ),
        runner.Outcome(
            "preemption",
            report="== Notice to router cut-off ==\n```not a fence end```",
            figures=[Figure("preemption", "webhook round trip, p99", 53.8, "ms", "p99 < 50 ms", False)],
        ),
        runner.Outcome(
            "router",
            report="== router: FAILED ==",
            error='Traceback (most recent call last):\n  File "bench/router.py", line 1\nRuntimeError: wrk failed (1)\n',
        ),
    ]


def render(load: float = 0.1) -> str:
    return runner.render(
        outcomes(),
        began_at=datetime(2026, 11, 30, 7, 5, tzinfo=UTC),
        seconds=95.0,
        command="python -m bench drain_reaction preemption router",
        machine=MACHINE,
        load_at_start=load,
    )


def test_summary_table_has_every_figure_with_its_target_and_verdict():
    text = render()
    assert "| benchmark | figure | value | target | met? |" in text
    assert "| drain_reaction | stop command seen, p99 | 44.80 ms | p99 < 100 ms | met |" in text
    assert "| drain_reaction | stop command seen, p50 | 32.90 ms |  |  |" in text
    assert "| preemption | webhook round trip, p99 | 53.80 ms | p99 < 50 ms | MISSED |" in text
    assert "1 figure(s) MISSED their target: preemption: webhook round trip, p99." in text


def test_failed_benchmark_is_listed_with_the_last_line_of_its_traceback():
    text = render()
    assert "| router | benchmark failed | RuntimeError: wrk failed (1) |  | FAILED |" in text
    assert "### router: FAILED" in text
    assert "`RuntimeError: wrk failed (1)`" in text
    assert "2/3 benchmarks completed in 95 s; FAILED: router." in text


def test_header_machine_and_reports():
    text = render()
    assert text.startswith("# Benchmarks\n")
    assert "Measured on 2026-11-30 07:05 UTC" in text
    assert "Command: `python -m bench drain_reaction preemption router`" in text
    assert "**Partial run**" in text and "`heartbeats`" in text.split("## Machine")[0]
    assert "## Machine" in text
    for label, value in MACHINE:
        assert f"- **{label}**: {value}" in text
    assert "conservative" not in text  # an idle machine: no note
    assert "### drain_reaction\n\nRan in 12 s.\n\n```text\n== Drain reaction ==" in text
    # A report with a backtick run of its own gets a longer fence.
    assert "````text\n== Notice to router cut-off ==\n```not a fence end```\n````" in text


def test_busy_machine_is_noted():
    assert "the load average was 1.70 when the run began (above 0.5)" in render(load=1.7)


def test_full_run_is_not_partial():
    done = [runner.Outcome(name, report=f"== {name} ==") for name in runner.BENCHMARKS]
    text = runner.render(done, began_at=datetime.now(UTC), seconds=1.0, command="python -m bench", machine=MACHINE,
                         load_at_start=0.0)
    assert "Partial run" not in text
    assert "8/8 benchmarks completed" in text
    assert "| heartbeats | no headline figure recorded (see its report) |" in text


def test_figure_value_text():
    assert Figure("b", "rate", 2368.4, "heartbeats/s").value_text() == "2,368.4 heartbeats/s"
    assert Figure("b", "ratio", 3.7, "x").value_text() == "3.70x"
    assert Figure("b", "stopped", 200, "of 200").value_text() == "200 of 200"
    assert Figure("b", "run 1", "timed out", "s").value_text() == "timed out"


def test_main_writes_the_report_for_a_run_with_a_failing_benchmark(tmp_path, monkeypatch):
    """The whole `python -m bench` path on two fake benchmark modules; servers unreachable, so nothing real is touched."""
    good = types.ModuleType("bench.fake_good")

    def good_run() -> str:
        bench.headline("fake_good", "answer time, p99", 12.5, "ms", target="p99 < 50 ms", met=True)
        return "== fake good ==\nall fine"

    def bad_run() -> str:
        bench.headline("fake_bad", "measured before failing", 3, "")
        raise RuntimeError("the fake benchmark broke")

    good.run = good_run
    bad = types.ModuleType("bench.fake_bad")
    bad.run = bad_run
    monkeypatch.setitem(sys.modules, "bench.fake_good", good)
    monkeypatch.setitem(sys.modules, "bench.fake_bad", bad)
    monkeypatch.setattr(runner, "BENCHMARKS", ["fake_good", "fake_bad", "fake_other"])
    report = tmp_path / "BENCHMARKS.md"
    monkeypatch.setenv("BENCH_REPORT", str(report))
    monkeypatch.setenv("BENCH_DATABASE_URL", "postgres://postgres:s3cret@127.0.0.1:1/nothing_bench")
    monkeypatch.setenv("BENCH_REDIS_URL", "redis://127.0.0.1:1/0")

    assert runner.main(["fake_good", "fake_bad"]) == 1

    text = report.read_text()
    assert "| fake_good | answer time, p99 | 12.50 ms | p99 < 50 ms | met |" in text
    assert "| fake_bad | measured before failing | 3 |  |  |" in text
    assert "| fake_bad | benchmark failed | RuntimeError: the fake benchmark broke |  | FAILED |" in text
    assert "**Partial run**" in text and "not run: `fake_other`" in text
    assert "python -m bench fake_good fake_bad" in text
    assert "s3cret" not in text and "postgres:***@" in text
    assert "- **PostgreSQL**: unknown (not reachable" in text
    assert "- **Redis**: unknown (not reachable" in text
    assert "- **CPU**: " in text and "- **Python**: " in text


@pytest.mark.parametrize("value", ["postgres://u:pw@h:5432/db", "redis://:pw@h:6379/0"])
def test_passwords_are_masked(value):
    assert "pw" not in runner._mask(value)
