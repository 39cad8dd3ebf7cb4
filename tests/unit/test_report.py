"""Benchmark tables: alignment, and missing measurements."""

from __future__ import annotations

import json
import re

from commpress.bench import report
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


def test_provenance_names_the_commit_that_ran(monkeypatch, tmp_path):
    """A figure is reproducible only at the code that made it: the checkout's commit (``+``
    with uncommitted changes), or ``unknown`` where commpress is not a git checkout."""
    commit = report.provenance()["commit"]
    assert re.fullmatch(r"[0-9a-f]{7,40}\+?|unknown", commit), commit
    fake_package = tmp_path / "commpress"
    fake_package.mkdir()
    monkeypatch.setattr(report.commpress, "__file__", str(fake_package / "__init__.py"))
    assert report.provenance()["commit"] == "unknown"


def test_json_holds_a_number_that_is_not_finite_as_null(tmp_path):
    """bench's JSON wrote a NaN rel_err (an output holding NaN) as the literal NaN, which
    JSON has not: strict readers (jq, JavaScript, Go) refused the whole file."""
    path = tmp_path / "rows.json"
    nan, inf = float("nan"), float("inf")
    report.write_json(path, [{"rel_err": nan, "tx_bytes": [1, inf], "time_us": 3.5}], where=-inf)

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    record = json.loads(path.read_text(), parse_constant=refuse)
    assert record["rows"] == [{"rel_err": None, "tx_bytes": [1, None], "time_us": 3.5}]
    assert record["where"] is None


def test_tables_show_an_infinity_as_the_json_does():
    """bench's ``rel_err`` of an output holding an infinity is inf: the JSON wrote null
    (as for NaN) and docs/benchmarks.md promises ``-``, but the table and markdown showed
    ``inf``."""
    rows = [{"run": "ring", "ms": float("inf"), "hidden": float("-inf")}]
    assert format_table(rows, COLUMNS).splitlines()[1].split() == ["ring", "-", "-"]
    assert markdown_table(rows, COLUMNS).splitlines()[2] == "| ring | - | - |"
