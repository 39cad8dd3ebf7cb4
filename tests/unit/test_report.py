"""Benchmark tables: alignment, and missing measurements."""

from __future__ import annotations

from commpress.bench.report import format_table, markdown_table

COLUMNS = (("run", "run", ""), ("ms", "step(ms)", ".1f"), ("hidden", "hidden", ".0%"))
ROWS = [{"run": "plain", "ms": 12.34, "hidden": float("nan")},
        {"run": "powersgd", "ms": 5.0, "hidden": 0.25}]  # fmt: skip


def test_tables_show_missing_measurements_as_a_dash():
    text = format_table(ROWS, COLUMNS).splitlines()
    assert text[1].split() == ["plain", "12.3", "-"]
    assert text[2].split() == ["powersgd", "5.0", "25%"]
    assert len({len(line) for line in text}) == 1  # right-aligned columns
    markdown = markdown_table(ROWS, COLUMNS).splitlines()
    assert markdown[2] == "| plain | 12.3 | - |"
