"""``commpress bench --hosts N --link RATE``: the sweep on the emulated cluster."""

from __future__ import annotations

import json

import pytest
import torch

import commpress as cp
from commpress.cli import main
from commpress.cluster import Layout, present
from commpress.schedules import algorithms, wire
from commpress.schedules.wire import HEADER_BYTES as CHECK_HEADER_BYTES
from commpress.transport.datagrams import HEADER_BYTES as DATAGRAM_HEADER_BYTES
from commpress.transport.datagrams import chunk_bytes_for
from commpress.units import torch_dtype

#: Most bytes of headers one packet carries: Ethernet 14, IPv4 20, TCP 20 + at most 40 of
#: options. The interface counts one header per segmentation-offload packet (up to 64 KiB),
#: ACKs included, so this times the packets sent bounds what a host sends beyond the payload.
HEADER_BYTES = 14 + 20 + 60
#: Per call: the bench's own barrier and timing all-reduce each iteration, gloo's message
#: framing (measured: 2.2 to 2.8 KB).
CONTROL_BYTES = 8 << 10
HOSTS = 4
MTU = 1500
SIZE = 2 << 20


def test_bench_on_the_cluster_reports_traffic_and_efficiency(prefix, tmp_path):
    path = tmp_path / "rows.json"
    argv = ["bench", "--hosts", "2", "--link", "1gbit", "--prefix", prefix, "-b", "8M", "-e", "8M",
            "-n", "2", "-w", "0", "--algorithm", "native,ring", "--codec", "int8",
            "--json", str(path)]  # fmt: skip
    assert main(argv) == 0
    rows = {row["algorithm"]: row for row in json.loads(path.read_text())["rows"]}
    assert present(Layout(prefix)) == []
    numel = (8 << 20) // 4 // 2
    expected_wire = {  # the ring's one message carries the argument check's header
        "native": 4 * numel,
        "ring": cp.get_codec("int8").wire_bytes(numel, torch.float32) + CHECK_HEADER_BYTES,
    }
    for algorithm, row in rows.items():
        wire = expected_wire[algorithm]
        assert row["wire_bytes"] == wire and len(row["tx_bytes"]) == 2
        assert all(wire <= sent <= 1.05 * wire + 16_384 for sent in row["tx_bytes"])
        # the ideal time counts the payloads only (the check's header is 3e-5 of them)
        assert row["ideal_us"] == pytest.approx(wire * 8 / 1e9 * 1e6, rel=1e-4)
        # The shaper lets a burst of 1 ms of line rate through at once: 3% of this transfer.
        assert 0 < row["efficiency"] <= 1.05
        assert row["link"].startswith("1gbit")


def test_bench_refuses_nprocs_with_hosts(prefix, capsys):
    argv = ["bench", "--hosts", "2", "--link", "1gbit", "--prefix", prefix, "--nprocs", "2"]
    assert main(argv) == 2
    assert "--nprocs is for local processes" in capsys.readouterr().err


def _bench_rows(prefix, tmp_path, op: str) -> dict:
    """Rows by dtype, then by (algorithm, codec): every dtype in one run of the bench."""
    path = tmp_path / f"{op}.json"
    argv = ["bench", "--hosts", str(HOSTS), "--link", "1gbit", "--prefix", prefix,
            "-b", str(SIZE), "-e", str(SIZE), "-n", "2", "-w", "1", "--op", op,
            "--algorithm", ",".join(algorithms(op)), "--codec", "none,int8",
            "--dtype", "float,bfloat16", "--json", str(path)]  # fmt: skip
    assert main(argv) == 0
    rows: dict = {"float": {}, "bfloat16": {}}
    for row in json.loads(path.read_text())["rows"]:
        rows[row["type"]][row["algorithm"], row["codec"]] = row
    return rows


def _slack(row: dict, host: int) -> float:
    # Segments TCP sent again (a shaped link dropped them: three senders to one host in an
    # all-to-all) cross the interface twice; measured per host, one MTU each at most. So do
    # the datagrams a multicast root sent again (a receiver overran: counted over all ranks).
    resent = (row["tx_retransmitted"][host] + row.get("repairs", 0)) * MTU
    # A multicast datagram carries the protocol's own header in its UDP payload; the
    # interfaces count a batch of them as one packet (one set of IP and UDP headers).
    datagram_headers = 0
    if row["algorithm"] == "multicast":
        datagrams = -(-row["wire_bytes"] // chunk_bytes_for(MTU))
        datagram_headers = datagrams * DATAGRAM_HEADER_BYTES
    return HEADER_BYTES * row["tx_packets"][host] + CONTROL_BYTES + resent + datagram_headers


def _assert_sends(row: dict, payload: int) -> None:
    """Every host sent ``payload`` bytes, plus at most its packets' headers and the bench's
    own synchronization."""
    for host, sent in enumerate(row["tx_bytes"]):
        assert payload <= sent <= payload + _slack(row, host), (
            f"{row['algorithm']} {row['codec']} {row['type']}: host {host} sent {sent} bytes "
            f"per call, the bench reports {payload}"
        )


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce"])
def test_reported_wire_bytes_are_what_the_hosts_send(prefix, tmp_path, op):
    """For every registered algorithm, the bytes its schedules say each rank sends."""
    rows = _bench_rows(prefix, tmp_path, op)
    assert rows["float"] and rows["float"].keys() == rows["bfloat16"].keys()
    for dtype, by_variant in rows.items():
        for (algorithm, codec), row in by_variant.items():
            assert row["wrong"] == 0, (algorithm, codec, dtype)
            if (op, algorithm) == ("reduce_scatter", "native"):
                # Measured: gloo's reduce-scatter all-reduces the whole tensor, twice the
                # bytes of a ring (reported as the ring's, the nccl-tests convention).
                twice = wire.wire_bytes(
                    "all_reduce", "native", "none", row["count"], HOSTS, torch_dtype(dtype)
                )
                _assert_sends(row, twice)
            else:
                _assert_sends(row, row["wire_bytes"])

    # A bf16 element costs `none@ring` 2 bytes, as it does native: half of a float's (at
    # the same size in bytes a bf16 tensor has twice the elements, and costs the same).
    half, full = rows["bfloat16"][("ring", "none")], rows["float"][("ring", "none")]
    native = rows["bfloat16"][("native", "none")]
    ring_bytes = SIZE * (HOSTS - 1) // HOSTS * (2 if op == "all_reduce" else 1)
    assert half["count"] == 2 * full["count"]
    count, dtype = half["count"], torch_dtype("bfloat16")
    checked = wire.wire_bytes(op, "ring", "none", count, HOSTS, dtype, in_band_check=True)
    headers = checked - wire.wire_bytes(op, "ring", "none", count, HOSTS, dtype)
    assert 0 < headers <= CHECK_HEADER_BYTES * HOSTS  # one per message of the chain
    assert half["wire_bytes"] == full["wire_bytes"] == native["wire_bytes"] + headers
    assert native["wire_bytes"] == ring_bytes
    for host, sent in enumerate(half["tx_bytes"]):
        assert sent <= native["tx_bytes"][host] + _slack(half, host)
        # each within its own slack of the same payload (the float run's segments sent
        # again are its own: once 33.6 KB against the bf16 run's 20.6 KB of slack)
        assert abs(sent - full["tx_bytes"][host]) <= max(_slack(half, host), _slack(full, host))


def test_the_bytes_of_a_tiny_call_are_its_own_not_the_timing_loops(prefix, tmp_path):
    """The counters' window held every timed call's barrier and reduction of its time,
    about 0.86 KB per call and host on 2 hosts (17.1 KB over 20 calls alone), more than the
    16-byte ring all-reduce's own frames (0.8 KB: 1.7 KB reported before)."""
    path = tmp_path / "rows.json"
    argv = ["bench", "--hosts", "2", "--link", "1gbit", "--prefix", prefix, "--op",
            "all_reduce", "-b", "16", "-e", "16", "-n", "20", "-w", "1", "--algorithm",
            "ring", "--codec", "none", "--json", str(path)]  # fmt: skip
    assert main(argv) == 0
    (row,) = [r for r in json.loads(path.read_text())["rows"] if r["algorithm"] == "ring"]
    assert all(0 < sent < 1200 for sent in row["tx_bytes"]), row["tx_bytes"]
