"""The reliability suite (issue #8): faults injected, invariants asserted, trials counted.

Each test calls the `fault_report` fixture with one line ("fault: ...: N trials,
..."). The line is printed (seen with -s) and carried on the test's report as a
user property, so it reaches the controller under xdist too; the terminal
summary lists every line under "fault figures".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

FAULT_LINES: list[tuple[str, str]] = []


@pytest.fixture
def fault_report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    def report(line: str) -> None:
        print(f"\n{line}")
        request.node.user_properties.append(("fault", line))

    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    for key, value in getattr(report, "user_properties", ()):
        if key == "fault":
            FAULT_LINES.append((report.nodeid, str(value)))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FAULT_LINES:
        return
    terminalreporter.write_sep("=", "fault figures (tests/faults)")
    for _nodeid, line in FAULT_LINES:
        terminalreporter.write_line(line)
