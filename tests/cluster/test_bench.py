"""``commpress bench --hosts N --link RATE``: the sweep on the emulated cluster."""

from __future__ import annotations

import json

import pytest
import torch

import commpress as cp
from commpress.cli import main
from commpress.cluster import Layout, present


def test_bench_on_the_cluster_reports_traffic_and_efficiency(prefix, tmp_path):
    path = tmp_path / "rows.json"
    argv = ["bench", "--hosts", "2", "--link", "1gbit", "--prefix", prefix, "-b", "8M", "-e", "8M",
            "-n", "2", "-w", "0", "--algorithm", "native,ring", "--codec", "int8",
            "--json", str(path)]  # fmt: skip
    assert main(argv) == 0
    rows = {row["algorithm"]: row for row in json.loads(path.read_text())["rows"]}
    assert present(Layout(prefix)) == []
    numel = (8 << 20) // 4 // 2
    expected_wire = {
        "native": 4 * numel,
        "ring": cp.get_codec("int8").wire_bytes(numel, torch.float32),
    }
    for algorithm, row in rows.items():
        wire = expected_wire[algorithm]
        assert row["wire_bytes"] == wire and len(row["tx_bytes"]) == 2
        assert all(wire <= sent <= 1.05 * wire + 16_384 for sent in row["tx_bytes"])
        assert row["ideal_us"] == pytest.approx(wire * 8 / 1e9 * 1e6)
        # The shaper lets a burst of 1 ms of line rate through at once: 3% of this transfer.
        assert 0 < row["efficiency"] <= 1.05
        assert row["link"].startswith("1gbit")


def test_bench_refuses_nprocs_with_hosts(prefix, capsys):
    argv = ["bench", "--hosts", "2", "--link", "1gbit", "--prefix", prefix, "--nprocs", "2"]
    assert main(argv) == 2
    assert "--nprocs is for local processes" in capsys.readouterr().err
