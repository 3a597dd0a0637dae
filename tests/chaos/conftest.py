"""The chaos suite: selected with ``-m chaos``, left out with ``-m 'not chaos'``.
Its table of faults and checks is printed in the terminal summary."""

from __future__ import annotations

import pytest

from tests.chaos import report


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaos: real processes under injected faults (tests/chaos, ~4 min)"
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if report.ROWS:
        terminalreporter.write_sep("=", "chaos: faults injected and what was checked")
        terminalreporter.write(report.render() + "\n")
