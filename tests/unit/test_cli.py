"""The ``commpress`` command line: the codec benchmark's output contract and its errors."""

from __future__ import annotations

import errno
import io
import json
import math
import os
import subprocess
import sys
import time
import warnings

import pytest

from commpress.cli import main
from commpress.cluster.local import FSDP_MODULES
from commpress.sim.model import Params, simulate
from commpress.sim.topology import Switch


def test_codecs_benchmark_writes_rows_for_each_codec(tmp_path, capsys):
    path = tmp_path / "rows.json"
    markdown = tmp_path / "report.md"
    argv = [
        "codecs",
        "--codec",
        "none",
        "--codec",
        "int8:impl=reference",
        "--numel",
        "5000",
        "--repeats",
        "1",
        "--json",
        str(path),
        "--markdown",
        str(markdown),
    ]
    assert main(argv) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [row["codec"] for row in rows] == ["none", "int8:impl=reference"]
    assert rows[0]["ratio"] == 1.0 and rows[0]["rel_err_gaussian"] == 0.0
    assert rows[1]["wire_bytes"] == 5000 + 4 * 20
    # RMS rounding error is step / sqrt(12) with step = absmax / 127, absmax ~ 3 sigma: ~7e-3.
    assert 3e-3 < rows[1]["rel_err_gaussian"] < 1.2e-2
    assert all(row["encode_gbps"] > 0 and row["memcpy_gbps"] > 0 for row in rows)
    assert "int8:impl=reference" in capsys.readouterr().out
    assert "**command**" in markdown.read_text()


@pytest.mark.parametrize("seed", [str(1 << 64), str(-(1 << 63) - 1)])
def test_codecs_refuses_a_seed_torch_cannot_take_naming_the_option(seed, capsys):
    """From a bug hunt: it said only 'Overflow when unpacking long long'."""
    with pytest.raises(SystemExit) as exit_info:
        main(["codecs", "--codec", "none", "--numel", "8", "--repeats", "1", "--seed", seed])
    assert exit_info.value.code == 2
    assert f"argument --seed: '{seed}': torch takes seeds in" in capsys.readouterr().err


def test_bad_codec_spec_is_a_clean_error(capsys):
    assert main(["codecs", "--codec", "int9"]) == 2
    assert "unknown codec 'int9'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["-f", "1"], "-f/--stepfactor: '1': must be at least 2 for the sweep to advance"),
        (["-n", "0"], "-n/--iters: '0': must be at least 1"),
        (["-n", "1.5"], "-n/--iters: '1.5' is not a whole number"),
        (["-w", "-1"], "-w/--warmup: '-1': must be at least 0"),
        (["--nprocs", "0"], "--nprocs: '0': must be at least 1"),
        (["-b", "0"], "-b/--minbytes: '0': must be at least 1 byte"),
        (["-b", "1X"], "-b/--minbytes: '1X' is not a size: bytes such as 1048576, 64K, 1M"),
        (["--codec", ","], "--codec: ',': must name at least one item"),
        (["--loss", "1"], "--loss: '1': must be in [0, 1)"),
    ],
)
def test_bench_rejects_sweeps_that_cannot_run_saying_why(argv, reason, capsys):
    """``-f 1`` used to loop forever; every such value is now a usage error. Its reason
    was written but not shown: argparse said 'invalid size_factor value: '1''."""
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == 2
    assert f"commpress bench: error: argument {reason}\n" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command", [["bench"], ["train"], ["launch", "--hosts", "2", "--", "true"]]
)
@pytest.mark.parametrize("timeout", ["0", "-5", "nan", "inf", "soon"])
def test_a_bad_timeout_is_a_usage_error_before_anything_runs(command, timeout, capsys):
    """``launch`` once built its cluster before it refused ``--timeout nan``."""
    argv = [command[0], "--timeout", timeout, *command[1:]]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"commpress {command[0]}: error: argument --timeout: '{timeout}': ")
    assert "positive, finite number of seconds" in last or "convert" in last


@pytest.mark.parametrize(
    ("text", "size"),
    [("1048576", 1 << 20), ("64K", 64 << 10), ("64KB", 64 << 10), ("64KiB", 64 << 10),
     ("1MiB", 1 << 20), ("1.5mib", 3 << 19), ("2GiB", 2 << 30), ("2g", 2 << 30)],
)  # fmt: skip
def test_sizes_take_binary_units_spelled_either_way(text, size):
    """1MiB, what the reports print, was refused as an invalid byte_size value."""
    from commpress.bench.arguments import byte_size

    assert byte_size(text) == size


@pytest.mark.parametrize("text", ["0.1K", "1.0000001M", "0.3k"])
def test_sizes_refuse_a_fraction_of_a_byte(text, capsys):
    """From a bug hunt: ``-b 0.1K`` was taken for 102 bytes (102.4 cut), ``1.0000001M``
    for 1M, without a word; a plain ``1.5`` is refused as not a size. sim's ``--size
    0.1K`` was refused as 'sizes are bytes such as 1048576, 64K, 1M', which it is."""
    with pytest.raises(SystemExit) as exit_info:
        main(["sim", "--size", f"1M,{text}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --size: '{text}' is " in err and "not a whole number of bytes" in err
    with pytest.raises(SystemExit):
        main(["bench", "-b", text])
    err = capsys.readouterr().err
    assert f"argument -b/--minbytes: '{text}' is " in err and "not a whole number of bytes" in err


@pytest.mark.parametrize("text", ["1iB", "1I", "MiB", "1KIIB", "1TiB"])
def test_sizes_refuse_what_is_not_a_unit(text):
    from commpress.bench.arguments import byte_size

    with pytest.raises(ValueError):
        byte_size(text)


def test_bench_rejects_a_first_size_above_the_last(capsys):
    assert main(["bench", "-b", "2M", "-e", "1M"]) == 2
    assert "must not exceed" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--algorithm", "rign"], "--algorithm 'rign': all_gather runs one of native, ring"),
        (["--op", "reduce_scatter", "--algorithm", "multicast"], "reduce_scatter runs one of"),
        (["--algorithm", "native,multicast"], "multicast sends IP multicast between the hosts"),
        (["--op", "all_reduce", "--algorithm", "auto"], "all_reduce runs one of native, ring,"),
        (["--op", "all_reduce", "--codec", "auto"], "the tuner chooses for all_gather and"),
        (["--codec", "int8:stochastic=1"], "--algorithm ring-hop with --codec int8:stochastic=1"),
        (["--op", "all_reduce", "--codec", "int8:stochastic=1"], "ring-hop re-encodes"),
    ],
)
def test_bench_checks_its_algorithms_before_any_process_starts(argv, message, capsys, monkeypatch):
    """Before, the ranks started and died with a traceback each (exit status 1)."""
    import commpress.bench.collectives as bench

    def no_processes(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(bench, "run_distributed", no_processes)
    assert main(["bench", "-b", "4K", "-e", "4K", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--json", "{missing}/rows.json"],
        ["bench", "--plot", "{folder}"],
        ["sim", "--json", "{missing}/rows.json"],
        ["sim", "--save-fit", "{missing}/fit.json", "--calibrate", "x.json"],
        ["codecs", "--markdown", "{missing}/codecs.md"],
        ["train", "--markdown", "{missing}/train.md"],
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_the_run(argv, tmp_path, capsys):
    """Before, a sweep ran to its end and then lost its rows to a FileNotFoundError."""
    missing = tmp_path / "no_such_folder"
    argv = [a.format(missing=missing, folder=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "does not exist" in error or "is a folder" in error


@pytest.mark.parametrize(
    "argv",
    [["bench", "--json", ""], ["codecs", "--markdown", " "], ["sim", "--plot", ""],
     ["train", "--out", ""]],
)  # fmt: skip
def test_an_empty_output_path_is_refused(argv, capsys, monkeypatch):
    """An empty --json (an unset shell variable) wrote nothing without a word; an empty
    --out wrote into the current folder and said the results were in /."""
    import importlib

    for module in ("bench.codecs", "bench.collectives", "bench.sim_command", "train.command"):
        ran = lambda args: pytest.fail("the command ran")  # noqa: E731
        monkeypatch.setattr(importlib.import_module(f"commpress.{module}"), "main", ran)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert f"argument {argv[1]}: an empty path" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["sim", "--fit", ""], ["sim", "--codec-speeds", " "], ["sim", "--calibrate", ""],
     ["bench", "--algorithm", "auto", "--tune-fit", ""]],
)  # fmt: skip
def test_an_empty_input_path_is_refused(argv, capsys, monkeypatch):
    """``sim --fit ""`` (an unset shell variable) ran on the model's defaults, exit 0;
    ``--calibrate ""`` said 'cannot read : Is a directory'; ``bench --tune-fit ""`` started
    the ranks, which each failed on that path (exit 1)."""
    import commpress.bench.collectives as bench

    monkeypatch.setattr(bench, "run_distributed", lambda *a, **k: pytest.fail("ranks ran"))
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert f"argument {argv[-2]}: an empty path" in capsys.readouterr().err


def test_bench_refuses_a_seed_of_no_loss(monkeypatch, capsys):
    """From a bug hunt: ``bench --algorithm multicast --seed 5`` without --loss ran, the
    seed (of the injected loss alone) unused, and the rows looked seeded."""
    import commpress.bench.collectives as bench

    monkeypatch.setattr(bench, "cluster_from", lambda args: pytest.fail("a cluster was built"))
    argv = ["bench", "--hosts", "2", "--link", "1gbit", "--algorithm", "multicast", "--seed", "5"]
    assert main(argv) == 2
    assert "--seed 5: the seed of --loss, which drops nothing (0)" in capsys.readouterr().err


def test_bench_refuses_more_roots_than_hosts(monkeypatch, capsys):
    """``bench --roots 8`` on 4 hosts ran as 4 roots at once (a round holds every host at
    most), its rows and command line saying 8."""
    import contextlib
    import types

    import commpress.bench.collectives as bench

    monkeypatch.setattr(bench, "cluster_from", lambda args: pytest.fail("a cluster was built"))
    argv = ["bench", "--hosts", "4", "--link", "1gbit", "--algorithm", "multicast", "--roots"]
    assert main([*argv, "8"]) == 2
    assert "--roots 8: more than the hosts (4)" in capsys.readouterr().err
    up = types.SimpleNamespace(hosts=3)  # a cluster that is up, its hosts not given
    monkeypatch.setattr(bench, "cluster_from", lambda args: contextlib.nullcontext(up))
    assert main(["bench", "--prefix", "cptup", "--algorithm", "multicast", "--roots", "4"]) == 2
    assert "--roots 4: more than the hosts (3)" in capsys.readouterr().err


def test_the_title_of_a_cluster_sweep_reads_as_the_clusters_description():
    """It read 'all_gather, 8 emulated hosts, 1gbit, mtu 9000 links' (the link's description
    with 'links' after its MTU); the cluster says 'links 1gbit, mtu 9000'."""
    from commpress.bench.collectives import title

    assert title("all_gather", 8, "1gbit, mtu 9000", 2, "500mbit") == (
        "all_gather, 8 emulated hosts, links 1gbit, mtu 9000, 2 racks, 500mbit uplinks"
    )


def test_sim_says_a_row_of_fewer_nodes_than_roots_has_every_node_a_root(capsys):
    """``sim --roots 8 --nodes 4`` printed the rows of K = 4, its --help silent on it (bench
    refuses such a K; sim keeps it, for a sweep of --nodes)."""
    from commpress import cli

    (roots,) = [action for _, action in _options_of(cli.build_parser(["sim"]), "")
                if "--roots" in action.option_strings]  # fmt: skip
    assert "fewer --nodes has every node a root at once" in roots.help
    argv = ["sim", "--nodes", "4", "--algorithm", "multicast", "--roots"]
    assert main([*argv, "8"]) == 0
    eight = capsys.readouterr().out
    assert main([*argv, "4"]) == 0
    assert eight == capsys.readouterr().out


def test_an_error_of_a_cluster_action_names_the_action_as_argparse_does(capsys):
    """'commpress cluster: error: hosts must be ...' for `cluster up`, whose argparse errors
    say 'commpress cluster up: error:'."""
    argv = ["cluster", "up", "--hosts", "4", "--racks", "3", "--link", "1gbit", "--prefix", "cptx"]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(
        "commpress cluster up: error: --racks 3 must divide --hosts 4"
    )
    bench = ["bench", "--hosts", "3", "--racks", "2", "--link", "1gbit", "--prefix", "cptx"]
    assert main(bench) == 2  # before any cluster is built: the options named there too
    assert "error: --racks 2 must divide --hosts 3" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [(["schedule", "--op", "all_gather", "--algoritm", "ring", "--world", "4"],
      "commpress schedule: error: unrecognized arguments: --algoritm (did you mean "
      "--algorithm?)"),
     (["bench", "--algoritm", "ring"],
      "commpress bench: error: unrecognized arguments: --algoritm ring (did you mean "
      "--algorithm?)"),
     (["cluster", "up", "--hosts", "2", "--lnk", "1gbit"],
      "commpress cluster up: error: unrecognized arguments: --lnk (did you mean --link?)"),
     (["cluster", "up", "--hosts", "2", "--link", "1gbit", "--prefx", "cp"],
      "commpress cluster up: error: unrecognized arguments: --prefx cp (did you mean "
      "--prefix?)"),
     (["bench", "--bogus"], "commpress bench: error: unrecognized arguments: --bogus\n")],
)  # fmt: skip
def test_a_misspelt_option_is_named_with_the_one_meant(argv, said, capsys):
    """From the new-user pass: ``schedule --algoritm ring`` said only that ``--algorithm``
    is required, and ``bench --algoritm ring`` named neither the command nor the option."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert said in capsys.readouterr().err


def test_an_abbreviated_option_still_works(capsys):
    assert main(["schedule", "--op", "all_gather", "--algo", "ring", "--world", "2"]) == 0
    assert "all_gather ring" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("option", "reason"),
    [(["--hosts", "255"], "--hosts: '255': must be in [1, 254]"),
     (["--mtu", "100"], "--mtu: '100': must be in [576, 65535]"),
     (["--link", "1gbps"], "--link: link rate '1gbps' is not understood"),
     (["--uplink", "8bit"], "--uplink: link rate '8bit' is below the minimum of 1mbit"),
     (["--delay", "1x"], "--delay: delay '1x' is not understood")],
)  # fmt: skip
@pytest.mark.parametrize(
    "command", [["cluster", "up", "--hosts", "2"], ["launch"], ["bench"], ["train"]]
)
def test_a_bad_cluster_option_is_refused_naming_it(command, option, reason, capsys):
    """From a bug hunt: ``launch --hosts 255`` said 'hosts must be between 1 and 254, got
    255', ``--mtu 100`` 'mtu must be between 576 and 65535', ``--link 1gbps`` 'link rate
    '1gbps' is not understood', naming no option as the other values' errors do."""
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--link", "1gbit", "--prefix", "cpnone", *option])
    assert exit_info.value.code == 2
    assert f"error: argument {reason}" in capsys.readouterr().err


def test_sim_adds_the_time_per_call_it_is_given(tmp_path):
    """``--call-us`` is the model's time per call, once a row; over a fit, it is the one
    that counts, as the other explicit values are."""
    rows = {}
    for name, extra in (("bare", []), ("called", ["--call-us", "1500"])):
        path = tmp_path / f"{name}.json"
        assert main(["sim", "--nodes", "4", "--json", str(path), *extra]) == 0
        rows[name] = json.loads(path.read_text())["rows"][0]["time_us"]
    assert rows["called"] - rows["bare"] == pytest.approx(1500)
    fit = {
        "format": "commpress-sim-fit",
        "version": 3,
        "message_s": {"ring": 0.0},
        "call_s": {"ring": 9.0},
        "efficiency": {"ring": 1.0},
        "codec_bytes_per_s": {},
    }
    (tmp_path / "fit.json").write_text(json.dumps(fit))  # fmt: skip
    argv = ["sim", "--nodes", "4", "--fit", str(tmp_path / "fit.json"), "--call-us", "0"]
    defaults = ["--message-us", "10", "--latency-us", "1"]  # the fit has none of its own
    assert main([*argv, *defaults, "--json", str(tmp_path / "over.json")]) == 0
    over = json.loads((tmp_path / "over.json").read_text())["rows"][0]["time_us"]
    assert over == pytest.approx(rows["bare"])  # 9 s per call in the fit, 0 given


def test_sim_fits_no_time_per_call_when_told_so(tmp_path, capsys):
    """``--no-call-time`` fits as version 2 did (the time per message takes the call's in);
    without ``--calibrate`` it is refused, as ``--save-fit`` is."""
    truth = Params(latency_s=0.0, message_s=300e-6, call_s=3e-3, efficiency=0.8)
    rows = []
    for n in (4, 8):
        for size in (1 << 20, 4 << 20, 16 << 20):
            row = simulate("all_gather", "backend", "int8", size, Switch(n, 1e9), truth)
            rows.append({"op": "all_gather", "algorithm": "backend", "codec": "int8",
                         "size_bytes": size, "time_us": row.time_us, "nprocs": n,
                         "link": "1gbit"})  # fmt: skip
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"provenance": {}, "rows": rows}))
    for extra, per_call in (([], True), (["--no-call-time"], False)):
        saved = tmp_path / f"fit{per_call}.json"
        argv = ["sim", "--calibrate", str(bench), "--save-fit", str(saved), "--algorithm",
                "backend", *extra]  # fmt: skip
        assert main(argv) == 0
        assert bool(json.loads(saved.read_text()).get("call_s")) is per_call
    capsys.readouterr()
    assert main(["sim", "--no-call-time"]) == 2
    assert "--no-call-time is for --calibrate" in capsys.readouterr().err


def test_sim_refuses_roots_without_multicast(capsys):
    """From a bug hunt: ``sim --roots 4`` with the default ``--algorithm ring`` printed the
    ring's rows, exit 0, as if K had been modelled (``bench`` refuses it)."""
    assert main(["sim", "--nodes", "4", "--roots", "4"]) == 2
    assert "--roots 4: for --algorithm multicast, which is not simulated" in (
        capsys.readouterr().err
    )
    assert main(["sim", "--nodes", "4", "--roots", "4", "--algorithm", "ring,multicast"]) == 0


def test_sim_refuses_an_uplink_efficiency_where_there_is_no_uplink(capsys):
    """From a bug hunt: ``sim --uplink-efficiency 0.5`` on the default one switch printed
    the rows of full efficiency, exit 0."""
    assert main(["sim", "--nodes", "4", "--uplink-efficiency", "0.5"]) == 2
    assert "which --topology switch has none of" in capsys.readouterr().err
    argv = ["sim", "--nodes", "4", "--uplink-efficiency", "0.5", "--topology", "racks:count=2"]
    assert main(argv) == 0


@pytest.mark.parametrize(
    ("option", "value", "reason"),
    [
        ("--efficiency", "1e-320", "at least 1e-06"),
        ("--efficiency", "1e-300", "at least 1e-06"),
        ("--uplink-efficiency", "1e-320", "at least 1e-06"),
        ("--exchange-efficiency", "1e-320", "at least 1e-06"),
        ("--latency-us", "1e308", "at most 1e+09"),
        ("--message-us", "1e308", "at most 1e+09"),
        ("--call-us", "1e308", "at most 1e+09"),
    ],
)
def test_sim_refuses_times_out_of_the_float_range(option, value, reason, capsys):
    """From a bug hunt: ``sim --efficiency 1e-320`` (a subnormal) made every time infinite,
    shown as '-', exit 0; ``--latency-us 1e308`` and ``--message-us 1e308`` too, and 1e-300
    or ``--call-us 1e308`` a time of 300 digits."""
    extra = ["--topology", "racks:count=2"] if option == "--uplink-efficiency" else []
    with pytest.raises(SystemExit) as exit_info:
        main(["sim", "--nodes", "4", option, value, *extra])
    assert exit_info.value.code == 2
    assert f"argument {option}: '{value}': must be" in (err := capsys.readouterr().err)
    assert reason in err


@pytest.mark.parametrize("value", ["1e-06", "1", "-0", "1e-320"])
def test_sim_takes_the_ends_of_the_ranges(value, tmp_path):
    option = "--efficiency" if value in ("1e-06", "1") else "--latency-us"
    path = tmp_path / "rows.json"
    assert main(["sim", "--nodes", "4", option, value, "--json", str(path)]) == 0
    assert math.isfinite(json.loads(path.read_text())["rows"][0]["time_us"])
    assert main(["sim", "--nodes", "4", "--call-us", "1e9", "--json", str(path)]) == 0


def test_sim_refuses_a_fit_whose_times_are_not_finite(tmp_path, capsys):
    """A fit file's efficiency has no floor of its own (a fit may reach 1e-6 and below)."""
    fit = {
        "format": "commpress-sim-fit",
        "version": 3,
        "message_s": {"ring": 0.0},
        "efficiency": {"ring": 1e-320},
        "codec_bytes_per_s": {},
    }
    (tmp_path / "fit.json").write_text(json.dumps(fit))
    with warnings.catch_warnings():  # numpy's "overflow encountered" printed before it
        warnings.simplefilter("error", RuntimeWarning)
        assert main(["sim", "--nodes", "4", "--fit", str(tmp_path / "fit.json")]) == 2
    assert "time of all_gather ring none" in (err := capsys.readouterr().err)
    assert "is not finite" in err


@pytest.mark.parametrize("value", ["all_gather,reduce_scatter", "all_gather, all_reduce"])
def test_bench_says_it_times_one_op_a_run(value, capsys):
    """``sim --op`` takes a comma list; ``bench --op all_gather,reduce_scatter`` said only
    'invalid choice', as if the ops were unknown."""
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--op", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --op: '{value}': one op a run" in err
    with pytest.raises(SystemExit):
        main(["bench", "--op", "all_scatter"])
    assert "argument --op: invalid choice: 'all_scatter'" in capsys.readouterr().err


def test_train_refuses_multicast_without_the_cluster(capsys):
    assert main(["train", "--steps", "1", "--compare", "int8@multicast/int8"]) == 2
    assert "multicast sends IP multicast between the hosts" in capsys.readouterr().err


def test_train_tells_the_tuner_the_clusters_links_as_bench_does(monkeypatch):
    """``commpress train --hosts N ... --compare auto`` left the tuner at its default
    network (100 Gbit/s, a host per core) where ``commpress bench`` tells it the cluster's
    links and that its hosts share this machine."""
    import contextlib
    import os
    from types import SimpleNamespace

    from commpress.sim import tuner
    from commpress.train import command, loop
    from commpress.transport import multicast

    cluster = SimpleNamespace(hosts=4, racks=2, link=SimpleNamespace(rate_bits=10**9),
                              uplink=SimpleNamespace(rate_bits=5 * 10**8))  # fmt: skip
    given = []

    def run(worker, config, timeout):
        given.append(config)
        raise ValueError("stopped before training")

    cluster.run = run
    monkeypatch.setattr(command, "cluster_from", lambda args: contextlib.nullcontext(cluster))
    argv = ["train", "--hosts", "4", "--link", "1gbit", "--racks", "2", "--uplink", "500mbit"]
    assert main([*argv, "--compare", "plain", "int8@auto"]) == 2
    network = {"topology": "racks:count=2,uplink=500mbit", "link": "1gbit", "fit": None,
               "shared_cores": os.cpu_count()}  # fmt: skip
    assert given[0].tune == network
    assert main([*argv, "--compare", "plain", "int8"]) == 2
    assert given[1].tune is None  # nothing tuned: the environment's network stays
    monkeypatch.setattr(multicast, "_default", None)  # what loop.configure sets: restored
    try:
        loop.configure(given[0])
        assert tuner.network() == tuner.Network(**network)
    finally:
        tuner.configure()


def test_train_refuses_nprocs_on_the_cluster_before_building_it(monkeypatch, capsys):
    """Before, --nprocs 3 was dropped without a word and the job ran one rank per host."""
    from commpress.train import command

    monkeypatch.setattr(command, "cluster_from", lambda args: pytest.fail("a cluster was built"))
    assert main(["train", "--nprocs", "3", "--hosts", "2", "--link", "1gbit"]) == 2
    assert "--nprocs is for local processes" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["double", "bf16", "FLOAT", "", "float,double", "float,"])
def test_bench_rejects_an_unknown_dtype(dtype, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--dtype", dtype])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --dtype: invalid choice" in err
    assert all(name in err.split("choose from")[1] for name in ("float", "bfloat16", "half"))


def test_bench_rejects_a_dtype_named_twice(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--dtype", "float,bfloat16,float"])
    assert exit_info.value.code == 2
    assert "argument --dtype: a dtype named twice" in capsys.readouterr().err


def test_bench_counts_elements_of_the_dtype(tmp_path):
    """Sizes stay bytes: 64 KiB of bf16 is 32K elements, and `none` sends 2 bytes each (the
    one message of 2 ranks also carries the argument check's 32-byte header, on gloo)."""
    path = tmp_path / "rows.json"
    argv = ["bench", "--nprocs", "2", "-b", "64K", "-e", "64K", "-n", "1", "-w", "0",
            "--op", "reduce_scatter", "--algorithm", "native,ring", "--codec", "none,int8",
            "--dtype", "bfloat16", "--json", str(path)]  # fmt: skip
    assert main(argv) == 0
    rows = {row["codec"] if row["algorithm"] == "ring" else "native": row
            for row in json.loads(path.read_text())["rows"]}  # fmt: skip
    assert {row["type"] for row in rows.values()} == {"bfloat16"}
    assert {row["count"] for row in rows.values()} == {32 << 10}
    assert rows["native"]["wire_bytes"] == rows["none"]["wire_bytes"] - 32 == 32 << 10
    assert rows["int8"]["wire_bytes"] == (16 << 10) + 4 * 64 + 32
    assert all(row["wrong"] == 0 for row in rows.values())


def test_bench_reports_the_size_it_moved_and_refuses_one_too_small(tmp_path, capsys):
    """1000 B of float on 3 ranks moves 3 x 83 elements: the row says 996 B (before: 1000,
    with a count of 250 and an algbw computed from 1000); 3 B moves nothing and is refused
    before any process starts."""
    path = tmp_path / "rows.json"
    argv = ["bench", "--nprocs", "3", "-b", "1000", "-e", "1000", "-n", "1", "-w", "0",
            "--algorithm", "native", "--json", str(path)]  # fmt: skip
    assert main([*argv, "--markdown", str(tmp_path / "rows.md")]) == 0
    (row,) = json.loads(path.read_text())["rows"]
    assert (row["size_bytes"], row["count"]) == (996, 249)
    title = "# all_gather, 3 local gloo processes, median of 1: compressed vs native\n"
    assert (tmp_path / "rows.md").read_text().startswith(title)  # it did not say of how many
    assert row["algbw_gbps"] == pytest.approx(996 / row["time_us"] / 1e3)
    assert main(["bench", "--nprocs", "3", "-b", "3", "-e", "3"]) == 2
    assert "needs at least 12 bytes (one element per rank)" in capsys.readouterr().err


def test_ci_runs_exactly_the_test_command_of_the_readme():
    """CI must test what a new user runs: the README's second command, verbatim."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    block = readme.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2, commands
    ci = [
        line
        for line in (root / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci == [commands[1]]
    assert "venv --clear" in commands[1] and "torch==2.13.0" in commands[1]


def test_one_of_a_thing_is_written_in_the_singular(capsys):
    """'1 hosts', '2 racks of 1 hosts', '1 local gloo processes', '1 layers', '1 steps'."""
    import types

    from commpress.bench.codecs import summary
    from commpress.bench.collectives import title
    from commpress.cluster import Emulated
    from commpress.train.command import heading
    from commpress.train.loop import TrainConfig
    from commpress.train.model import GPTConfig

    assert Emulated(1, "1gbit").describe().startswith("1 host, links 1gbit")
    assert "2 racks of 1 host, uplinks" in Emulated(2, "1gbit", racks=2).describe()
    assert title("all_gather", 1, None) == "all_gather, 1 local gloo process"
    assert title("all_gather", 1, "1gbit") == "all_gather, 1 emulated host, links 1gbit"
    one = TrainConfig(runs=(), model=GPTConfig(layers=1), steps=1)
    assert heading(one, "1 local gloo process").startswith("FSDP GPT (1 layer, dim 128, ")
    assert ", 1 step, adamw" in heading(one, "1 local gloo process")
    codecs = types.SimpleNamespace(numel=1, threads=1, repeats=1)
    measured = {"memcpy_gbps": 1.0, "read_gbps": 1.0}
    assert summary(codecs, measured).startswith("1 fp32 value (3.81e-06 MiB), 1 thread, ")
    argv = ["schedule", "--op", "all_gather", "--algorithm", "ring", "--world", "2"]
    assert main([*argv, "--rank", "0", "--numel", "1"]) == 0
    assert "chunk of 1 element encoded as float32, over p2p; 1 step, 1 round, 4 bytes sent" in (
        capsys.readouterr().out
    )


# ---------------------------------------------------------------- commpress schedule


def test_schedule_prints_every_ranks_steps(capsys):
    argv = ["schedule", "--op", "all_gather", "--algorithm", "ring", "--world", "4",
            "--numel", "1000", "--codec", "int8"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    heads = [line for line in out.splitlines() if line.startswith("all_gather ring")]
    assert [head.split(", rank ")[1].split(":")[0] for head in heads] == [
        f"{rank} of 4" for rank in range(4)
    ]
    wire = 1000 + 4 * 4  # int8: a byte per element, an fp32 scale per block of 256
    assert out.count("send    chunk") == out.count("receive chunk") == 4 * 3
    assert out.count(f", {wire} B") == 4 * 3 * 2
    assert out.splitlines()[-1] == (
        f"bytes sent per call by the busiest rank: {3 * wire} ({3 * 4000} native)"
    )


def test_schedule_of_one_rank_is_its_plan_printed():
    """An all-reduce prints its two schedules, reduce-scatter then all-gather."""
    import subprocess
    import sys

    import torch

    from commpress.schedules import plan

    argv = ["--op", "all_reduce", "--algorithm", "alltoall", "--world", "5", "--rank", "2",
            "--numel", "4096", "--dtype", "bfloat16", "--codec", "int8",
            "--chunk-bytes", "1024"]  # fmt: skip
    # once through the installed entry point's module: the exit code and stdout a shell sees
    done = subprocess.run(
        [sys.executable, "-m", "commpress.cli", "schedule", *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    schedules = plan("all_reduce", "alltoall", 2, 5, 4096, torch.bfloat16, "int8", 1024)
    assert [s.op for s in schedules] == ["reduce_scatter", "all_gather"]
    expected = "\n\n".join(str(schedule) for schedule in schedules)
    assert done.stdout.startswith(expected + "\n\nbytes sent per call by the busiest rank: ")


@pytest.mark.parametrize(
    "op, algorithm, world, numel, posted",
    [
        ("reduce_scatter", "alltoall", 4, 1 << 18, "the backend's all-to-all"),  # 256 KiB a peer
        ("reduce_scatter", "alltoall", 4, (1 << 18) - 4, None),  # a float less a peer
        ("all_gather", "backend", 2, 1 << 16, "the backend's all-gather"),
        ("all_gather", "backend", 3, 1 << 20, None),  # gloo's ring: several peers in turn
        ("all_gather", "ring", 2, 1 << 20, None),  # point to point already
    ],
)
def test_schedule_says_where_gloo_posts_the_backends_collective_point_to_point(
    op, algorithm, world, numel, posted, capsys
):
    """The executor's choice (``point_to_point_on_gloo``), which the schedule cannot name."""
    argv = ["schedule", "--op", op, "--algorithm", algorithm, "--world", str(world),
            "--rank", "0", "--numel", str(numel)]  # fmt: skip
    assert main(argv) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    if posted is None:
        assert last.startswith("bytes sent per call"), last
    else:
        assert last.startswith(f"on gloo (CPU tensors) {posted} is posted as point-to-point")
        assert last.endswith("262144 bytes per peer")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--op", "all_gather", "--algorithm", "alltoall"], "'alltoall' is not an algorithm of"),
        (["--op", "reduce_scatter", "--algorithm", "native"], "'native' is torch.distributed"),
        (["--op", "all_gather", "--algorithm", "ring", "--rank", "4"], "--rank must be in [0, 4)"),
        (["--op", "all_gather", "--algorithm", "ring", "--rank", "-1"], "got -1"),
        (["--op", "all_gather", "--algorithm", "ring", "--codec", "int9"], "unknown codec"),
        (  # before: printed, as if a call could run it
            ["--op", "all_reduce", "--algorithm", "ring-hop", "--codec", "int8:stochastic=1"],
            "ring-hop re-encodes at every hop and int8:stochastic=true is not idempotent",
        ),
        (  # before: chunks of 3 elements, 12 in all, and no word
            ["--op", "reduce_scatter", "--algorithm", "ring", "--numel", "10"],
            "--numel 10 does not split into 4 equal chunks",
        ),
    ],
)
def test_schedule_rejects_bad_input_in_one_line(argv, message, capsys):
    assert main(["schedule", "--world", "4", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("commpress schedule: error: ")
    assert message in captured.err and captured.err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--world", "0"], "argument --world: '0': must be at least 1"),
        (["--world", "100000"], "argument --world: '100000': at most 65536 ranks"),
        (["--dtype", "double"], "argument --dtype: invalid choice: 'double'"),
        (["--chunk-bytes", "3"], "argument --chunk-bytes: '3': a collective's chunk_bytes is"),
        (["--numel", "-1"], "argument --numel: '-1': must be at least 0"),
    ],
)
def test_schedule_argument_errors_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["schedule", "--op", "all_gather", "--algorithm", "ring", "--world", "4", *argv])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]  # after argparse's usage
    assert last.startswith(f"commpress schedule: error: {message}")


def test_schedule_of_every_rank_is_refused_past_a_few_hundred_ranks(capsys):
    """From a bug hunt: ``--world 100000`` set out to print every rank's 99999 steps,
    10**10 lines, all made before the first was printed (``--world 1024``: 2 million
    lines, 1.4 GB). One rank's schedule is still printed at that world."""
    argv = ["schedule", "--op", "all_gather", "--algorithm", "ring", "--numel", "1"]
    assert main([*argv, "--world", "257"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--world 257 without --rank prints every rank's schedule" in captured.err
    assert "at most 256 ranks; give --rank" in captured.err
    assert main([*argv, "--world", "257", "--rank", "3"]) == 0
    assert "rank 3 of 257" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--op", "reduce_scatter", "--algorithm", "ring", "--world", "256", "--chunk-bytes",
             "4"],
            "--chunk-bytes 4 cuts each chunk of 4096 elements into 4096 pieces: 256 ranks x 255 "
            "rounds x 4096 pieces, 267386880 steps to print, at most 65536",
        ),
        (
            ["--op", "reduce_scatter", "--algorithm", "alltoall", "--world", "2", "--rank", "0",
             "--numel", str(1 << 26), "--chunk-bytes", "4"],
            "into 33554432 pieces: 1 rank x 1 round x 33554432 pieces",
        ),
        (
            ["--op", "all_reduce", "--algorithm", "ring", "--world", "2", "--rank", "1",
             "--numel", str(1 << 40)],
            "--chunk-bytes 2097152 cuts each chunk of 549755813888 elements into 1048576 pieces: "
            "1 rank x 1 round x 1048576 pieces, 1048576 steps to print, at most 65536: give a "
            "larger --chunk-bytes or a smaller --numel",
        ),
    ],
)  # fmt: skip
def test_schedule_refuses_more_pipeline_pieces_than_it_can_print(
    argv, message, monkeypatch, capsys
):
    """From a bug hunt: ``--world`` was bounded, the pieces of a pipelined reduction were
    not: ``--op reduce_scatter --algorithm ring --world 256 --chunk-bytes 4`` set out to
    make 267 million steps before printing the first, and was killed for its memory (about
    1 KB a step); so was ``--world 2 --numel 64M --chunk-bytes 4``."""
    import commpress.bench.schedule_command as command

    monkeypatch.setattr(command, "plan", lambda *a, **k: pytest.fail("planned"))
    assert main(["schedule", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("commpress schedule: error: ")
    assert message in captured.err and captured.err.count("\n") == 1


def test_schedule_prints_pipeline_pieces_up_to_its_most_steps(monkeypatch, capsys):
    import commpress.bench.schedule_command as command

    monkeypatch.setattr(command, "MAX_PIECE_STEPS", 8)
    argv = ["schedule", "--op", "reduce_scatter", "--algorithm", "ring", "--world", "3"]
    argv += ["--numel", "12", "--chunk-bytes", "4"]  # chunks of 4 elements, 4 pieces each
    assert main([*argv, "--rank", "0"]) == 0  # 2 rounds x 4 pieces
    assert "8 steps" in capsys.readouterr().out
    assert main(argv) == 2  # every rank's: 24
    assert "3 ranks x 2 rounds x 4 pieces, 24 steps to print, at most 8" in (
        capsys.readouterr().err
    )


def test_schedule_needs_an_op_an_algorithm_and_a_world(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["schedule"])
    assert exit_info.value.code == 2
    assert "required: --op, --algorithm, --world" in capsys.readouterr().err


def _run(code: str) -> str:
    """What a fresh interpreter prints running ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter has imported after running ``code``."""
    return set(_run(f"import sys\n{code}\nprint(' '.join(sys.modules))").split())


@pytest.mark.parametrize(
    "argv", [["cluster", "status", "--prefix", "cpt-none"], ["launch", "--help"], ["--help"], []]
)
def test_the_cluster_commands_and_the_help_do_not_import_torch(argv):
    code = f"from commpress.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"
    assert "torch" not in _modules_after(code)


def test_import_commpress_imports_torch_only_when_a_name_needs_it():
    assert "torch" not in _modules_after("import commpress")
    # the probe sees torch where it is imported (a probe that cannot see it proves nothing)
    assert "torch" in _modules_after("import commpress\ncommpress.all_reduce")


def test_every_public_name_is_the_object_its_module_defines():
    """In a fresh interpreter, where nothing but the table can have set the names."""
    code = """
import importlib, commpress
for name, (module, attribute) in commpress._PUBLIC.items():
    expected = importlib.import_module(module)
    expected = expected if attribute is None else getattr(expected, attribute)
    assert getattr(commpress, name) is expected, name
assert sorted(commpress.__all__) == sorted(["__version__", *commpress._PUBLIC])
listed = dir(commpress)
assert set(commpress._PUBLIC) <= set(listed) and "__version__" in listed
assert not {"TYPE_CHECKING", "annotations", "importlib"} & set(listed), listed
assert commpress.sim.tuner is importlib.import_module("commpress.sim.tuner")
assert not hasattr(commpress, "sim.tuner") and not hasattr(commpress, "no_such_module")
try:
    commpress.no_such_name
except AttributeError as error:
    assert "no_such_name" in str(error)
else:
    raise AssertionError("no error for an unknown name")
print("ok")
"""
    assert _run(code).strip() == "ok"


def test_the_type_checking_imports_are_the_table_of_public_names():
    """What IDEs and type checkers read (the ``TYPE_CHECKING`` block) names the same
    objects as the table the package serves at run time."""
    import ast
    import importlib
    import inspect

    import commpress

    tree = ast.parse(inspect.getsource(commpress))
    block = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )

    def from_import(module: str, name: str):
        """What ``from module import name`` binds: the attribute, else the submodule."""
        try:
            return getattr(importlib.import_module(module), name)
        except AttributeError:
            return importlib.import_module(f"{module}.{name}")

    imported = {
        alias.asname or alias.name: from_import(statement.module, alias.name)
        for statement in block.body
        for alias in statement.names
    }
    assert sorted(imported) == sorted(commpress._PUBLIC)
    for name, value in imported.items():
        assert getattr(commpress, name) is value, name


def test_a_command_whose_dependency_is_missing_is_a_one_line_error(monkeypatch, capsys):
    import commpress.cli as cli

    help_text, _, add_arguments, handler = cli.COMMANDS["sim"]
    missing = (help_text, "no_such_dependency", add_arguments, handler)
    monkeypatch.setitem(cli.COMMANDS, "sim", missing)
    assert main(["sim", "--nodes", "4"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("commpress sim: error: No module named 'no_such_dependency'")
    assert error.count("\n") == 1 and "Traceback" not in error
    # a module of commpress itself that is missing is a defect: its traceback is kept
    ours = (help_text, "commpress.no_such_module", add_arguments, handler)
    monkeypatch.setitem(cli.COMMANDS, "sim", ours)
    with pytest.raises(ModuleNotFoundError, match="commpress.no_such_module"):
        main(["sim", "--nodes", "4"])


def test_an_unknown_dtype_name_is_a_value_error_naming_the_choices():
    import torch

    from commpress.units import torch_dtype

    assert torch_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of.*'float'.*got 'double'"):
        torch_dtype("double")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "-b", "infK"], "'infK': must be a finite number of bytes"),
        (["bench", "-b", "1e400K"], "'1e400K': must be a finite number of bytes"),
        (["sim", "--size", "infK"], "--size: 'infK': must be a finite number of bytes"),
        (["sim", "--nodes", "8,8"], "'8,8' names 8 twice"),
        (["sim", "--codec", "int8,none,int8"], "names int8 twice"),
        (["bench", "--algorithm", "ring,ring"], "names ring twice"),
        (["launch", "--hosts", "2", "--port", "70000", "--", "true"], "'70000': must be a port"),
        (["launch", "--hosts", "2", "--port", "0", "--", "true"], "'0': must be a port"),
        (["codecs", "--seed", "x"], "argument --seed: 'x' is not a whole number"),
        (["sim", "--latency-us", "inf"], "argument --latency-us: 'inf': must be finite"),
        (["sim", "--message-us", "inf"], "argument --message-us: 'inf': must be finite"),
        (["sim", "--latency-us", "-1"], "argument --latency-us: '-1': must be finite and at"),
        (["sim", "--message-us", "nan"], "argument --message-us: 'nan': must be finite and at"),
        (["sim", "--call-us", "-1"], "argument --call-us: '-1': must be finite and at"),
        (["sim", "--latency-us", "1us"], "argument --latency-us: '1us' is not a number"),
        (["sim", "--efficiency", "2"], "argument --efficiency: '2': must be above 0 and at most"),
        (["sim", "--uplink-efficiency", "0"], "argument --uplink-efficiency: '0': must be above"),
        (["sim", "--exchange-efficiency", "-1"], "argument --exchange-efficiency: '-1': must"),
        (  # the same rule and words as `commpress cluster up --hosts 8 --racks 3`
            ["sim", "--topology", "racks:count=3", "--nodes", "6,8"],
            "--topology racks:count=3 --nodes 8: racks must divide hosts (every rack holds as "
            "many hosts): racks=3, hosts=8",
        ),
        (["train", "--lr", "inf"], "argument --lr: 'inf': must be above 0 and finite"),
        (["train", "--lr", "-1"], "argument --lr: '-1': must be above 0 and finite"),
        (["train", "--lr", "0"], "argument --lr: '0': must be above 0 and finite"),
        (["train", "--lr", "nan"], "argument --lr: 'nan': must be above 0 and finite"),
        (["train", "--lr", "fast"], "argument --lr: 'fast' is not a number"),
        (["train", "--compare", "plain", "int8", "plain"], "--compare names plain twice"),
        (["train", "--seed", str(2**64 - 1)], f"argument --seed: '{2**64 - 1}': must be in"),
        (["train", "--seed", str(-(2**43) - 1)], f"argument --seed: '{-(2**43) - 1}': must be"),
        (["train", "--seed", "1.5"], "argument --seed: '1.5' is not a whole number"),
        (["codecs", "--codec", "none", "--codec", "none"], "--codec none given twice"),
        (
            ["codecs", "--codec", "none", "--numel", "8", "--repeats", "1", "--threads", "100000"],
            "argument --threads: '100000': at most the",
        ),
        (["sim", "--nodes", "8,08"], "'8' and '08' are the same"),
        (["sim", "--size", "1M,1048576"], "'1M' and '1048576' are the same"),
        (["sim", "--link", "1gbit,1000mbit"], "'1gbit' and '1000mbit' are the same"),
        (["sim", "--codec", "int8,int8:block=256"], "'int8' and 'int8:block=256' are the same"),
        (["bench", "--codec", "int4,int4:block=256"], "'int4' and 'int4:block=256' are the same"),
        (
            ["codecs", "--codec", "zfp", "--codec", "zfp:rate=16"],
            "'zfp' and 'zfp:rate=16' are the same",
        ),
        (
            ["bench", "--algorithm", "ring", "--loss", "0.5"],
            "--loss 0.5: for --algorithm multicast",
        ),
        (["bench", "--seed", "3"], "--seed 3: for --algorithm multicast"),
        (["bench", "--tune-fit", os.devnull], f"--tune-fit {os.devnull}: for --algorithm auto"),
        (["bench", "--algorithm", "ring", "--roots", "3"], "--roots 3: for --algorithm multicast"),
        (  # the tuner's candidates in the bench leave multicast out: nothing would use it
            ["bench", "--algorithm", "auto", "--loss", "0.5"],
            "--loss 0.5: for --algorithm multicast",
        ),
    ],
)
def test_malformed_values_are_refused_naming_the_option(argv, message, capsys):
    """From bug hunts: infinite sizes were tracebacks (OverflowError), repeated list
    entries repeated rows (also one value written two ways: 1M and 1048576), a port above
    65535 failed in every rank, as did a train --seed past 64 bits once scaled for the
    ranks' batches (2**64 - 1, or a time in nanoseconds), infinite latencies and learning
    rates ran (to inf, to NaN), 100000 codec threads crashed torch (SIGSEGV); train's
    learning rates and seeds out of range were refused by the run's configuration, which
    did not name the option; sim's times
    and efficiencies out of range were named by the model's fields (latency_s, -1e-06), and
    it modelled racks of unequal size, which the emulated cluster refuses."""
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_train_checks_its_output_folder_before_training(tmp_path, capsys):
    """``--out`` naming a file failed only after the whole run, losing its results."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--out", str(a_file)])
    assert exit_info.value.code == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--out", str(a_file / "below")])
    assert "is not a writable folder" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: os.access refuses /proc to others")
@pytest.mark.parametrize(
    "argv",
    [["train", "--out", "/proc/commpress-out"], ["bench", "--json", "/proc/rows.json"],
     ["train", "--markdown", "/proc/train.md"]],
)  # fmt: skip
def test_an_output_in_a_folder_root_cannot_write_in_is_refused_before_the_run(argv, capsys):
    """As root, ``os.access`` says every folder is writable, /proc too: ``train --out
    /proc/x`` trained to the end, then lost the run to a FileNotFoundError."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "writable" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["summary.json", "losses.csv", "loss.png", "."])
def test_train_refuses_a_markdown_path_that_out_writes(name, tmp_path, monkeypatch, capsys):
    """``--markdown OUT/summary.json`` replaced the summary with the table, exit 0;
    ``--markdown OUT`` (a folder the run makes) ended the run in IsADirectoryError."""
    from commpress.train import command

    def started(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(command, "run_distributed", started)
    out = tmp_path / "results"
    if name == ".":  # not made yet: --markdown's own check cannot see that it is one
        markdown = out
    else:
        out.mkdir()
        markdown = out / name
    assert main(["train", "--out", str(out), "--markdown", str(markdown)]) == 2
    assert "give the table a path of its own" in capsys.readouterr().err


def test_train_refuses_a_context_longer_than_the_held_out_text(monkeypatch, capsys):
    """Training ran to its last step, then the held-out evaluation raised 'random_ expects
    from to be less than to' on every rank, losing the run."""
    from commpress.train import command
    from commpress.train.data import Corpus

    def started(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(command, "run_distributed", started)
    held_out = len(Corpus.standard_library().validation)
    assert main(["train", "--context", str(held_out)]) == 2
    assert f"at most {held_out - 1}" in capsys.readouterr().err


def test_a_failed_rank_ends_the_command_with_its_error_alone(monkeypatch, capsys):
    """A rank's failure (or a job's timeout) left the command in a traceback of its own
    (cli, command, run_distributed, _collect) around the rank's."""
    from commpress.cluster.local import DistributedError
    from commpress.train import command

    def failed(*args, **kwargs):
        raise DistributedError("rank 1 failed:\nTraceback ...\nValueError: the rank's own")

    monkeypatch.setattr(command, "run_distributed", failed)
    assert main(["train", "--compare", "plain"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("commpress train: rank 1 failed:\n")
    assert err.count("Traceback") == 1 and err.count("the rank's own") == 1


def _outlives_its_timeout(rank, world_size, config):
    time.sleep(60)


def test_a_timeout_ends_bench_with_status_124_as_it_ends_launch(monkeypatch, capsys):
    """bench and train exited 1 when their ranks outlived --timeout, as for a failed rank,
    where launch gives 124 (timeout(1)'s status)."""
    import commpress.bench.collectives as bench

    monkeypatch.setattr(bench, "_worker", _outlives_its_timeout)
    argv = ["bench", "-b", "1K", "-e", "1K", "--nprocs", "2", "--timeout", "0.5"]
    assert main(argv) == 124
    assert "commpress bench: ranks [0, 1] did not finish within 0.5 s" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("strategy", "first", "second"),
    [
        ("fsdp", "plain", "none@native"),
        ("fsdp", "int8", "int8:block=256@ring"),
        ("fsdp", "int4", "int4/int4"),
        ("fsdp", "plain", "int8@native"),  # torch's collective ignores the codec
        ("ddp", "int8@alltoall", "int8:block=256@alltoall"),
        ("ddp", "powersgd:rank=4", "powersgd:rank=4,start_iter=10"),  # the defaults
        ("ddp", "acpsgd:rank=2@serial", "acpsgd:rank=2,seed=0@serial"),
        ("ddp", "torch-powersgd:start_iter=2", "torch-powersgd:rank=4,start_iter=2"),
    ],
)
def test_train_refuses_one_configuration_written_two_ways(
    strategy, first, second, monkeypatch, capsys
):
    """bench, sim and codecs refuse int8 beside int8:block=256 (rows repeated); train ran
    such a configuration twice under two labels, as if they differed."""
    from commpress.train import command

    def started(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(command, "run_distributed", started)
    assert main(["train", "--strategy", strategy, "--compare", first, second]) == 2
    assert f"{first!r} and {second!r} are the same configuration" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("spec", "lowrank"), [("powersgd@serial", "powersgd"), ("acpsgd@serial", "acpsgd")]
)
def test_train_takes_a_low_rank_spec_without_options_at_serial(spec, lowrank, monkeypatch):
    """``--compare powersgd@serial`` (what --help offers, with the options left at their
    defaults) was read as a quantization spec: "reduce spec='powersgd@serial': unknown
    algorithm 'serial'", exit 2, while ``powersgd`` alone ran."""
    from commpress.train import command

    started = []

    def run(worker, nprocs, config, timeout):
        started.append(config)
        raise SystemExit(0)

    monkeypatch.setattr(command, "run_distributed", run)
    with pytest.raises(SystemExit):
        main(["train", "--strategy", "ddp", "--compare", spec])
    (config,) = started
    (run_spec,) = config.runs
    assert (run_spec.lowrank, run_spec.scheduler) == (lowrank, False)


@pytest.mark.parametrize(
    ("strategy", "spec", "message"),
    [
        ("fsdp", "powersgd@serial", "low-rank compression needs --strategy ddp"),
        ("ddp", "torch-powersgd@serial", "torch's PowerSGD hook has no scheduler of ours"),
        ("ddp", "powersgd@", "nothing after '@'"),  # it trained as powersgd, the scheduler on
        ("ddp", "torch-powersgd@", "nothing after '@'"),
        ("ddp", "acpsgd:rank=2@", "nothing after '@'"),
    ],
)
def test_train_names_a_low_rank_spec_at_serial_as_low_rank(
    strategy, spec, message, monkeypatch, capsys
):
    """Without options, ``NAME@serial`` was refused as an unknown algorithm of a
    quantization spec rather than with what is wrong with the low-rank one."""
    from commpress.train import command

    def started(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(command, "run_distributed", started)
    assert main(["train", "--strategy", strategy, "--compare", spec]) == 2
    assert message in capsys.readouterr().err


def test_train_preloads_fsdp_in_the_fork_server_for_fsdp_runs_only(monkeypatch):
    """Every rank of an FSDP run imports FSDP2 and torch._dynamo: the server does, once."""
    from commpress.train import command

    preloaded = []

    def started(*args, **kwargs):
        raise KeyboardInterrupt  # the runs themselves are not this test's

    monkeypatch.setattr(command, "preload", lambda *modules: preloaded.append(modules))
    monkeypatch.setattr(command, "run_distributed", started)
    for strategy in ("fsdp", "ddp"):
        assert main(["train", "--strategy", strategy]) == 130  # stopped as it started
    assert preloaded == [FSDP_MODULES]


def test_train_refuses_a_stochastic_fsdp_all_gather_before_training(monkeypatch, capsys):
    """cp.fsdp.compress refuses it in the ranks; train must say so before they start."""
    from commpress.train import command

    def started(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(command, "run_distributed", started)
    assert main(["train", "--compare", "int8:stochastic=true/int8"]) == 2
    err = capsys.readouterr().err
    assert "all-gather spec='int8:stochastic=true': FSDP2 all-gathers the parameters" in err


def test_a_reader_that_stops_reading_ends_the_command_without_a_traceback():
    """``commpress schedule ... | head -1`` ended in a BrokenPipeError traceback."""
    import subprocess
    import sys

    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    command = [sys.executable, "-m", "commpress.cli", "schedule", "--op", "all_gather",
               "--algorithm", "ring", "--world", "64"]  # fmt: skip
    done = subprocess.run(command, stdout=reader.stdin, stderr=subprocess.PIPE, text=True)
    reader.stdin.close()
    assert reader.stdout.read() and reader.wait() == 0
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 141  # 128 + SIGPIPE, as a shell tool's


def test_a_reader_gone_before_a_short_output_ends_the_command_quietly():
    """``commpress sim ... | true``: a table shorter than the output buffer was written at
    the interpreter's exit, which said 'Exception ignored ... BrokenPipeError', exit 120."""
    import os

    read, write = os.pipe()
    os.close(read)
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    command = [sys.executable, "-m", "commpress.cli", "schedule", "--op", "all_gather",
               "--algorithm", "ring", "--world", "2", "--numel", "8"]  # fmt: skip
    done = subprocess.run(command, stdout=write, stderr=subprocess.PIPE, text=True, env=env)
    os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


def test_a_failed_command_whose_reader_has_gone_keeps_its_status(monkeypatch):
    """Flushing standard output before returning turned a failed job's status into 141
    where its reader had gone with output still buffered (``launch ... | head -1`` of a job
    that exits 3, without PYTHONUNBUFFERED)."""
    import os

    from commpress.bench import schedule_command

    read, write = os.pipe()
    os.close(read)
    stdout = open(write, "w")  # noqa: SIM115 - closed below, after main has used it

    def fails(args):
        print("output still in the buffer")
        return 3

    monkeypatch.setattr(schedule_command, "run", fails)
    monkeypatch.setattr(sys, "stdout", stdout)
    try:
        assert main(["schedule", "--op", "all_gather", "--algorithm", "ring", "--world", "2"]) == 3
    finally:
        stdout.close()


class _ReaderGone(io.StringIO):
    """Standard output whose reader has gone, as a pipe written unbuffered
    (``PYTHONUNBUFFERED``) reports it at the first print."""

    def write(self, text):
        raise BrokenPipeError(errno.EPIPE, "the reader has gone")


_BENCH_ROW = {"op": "all_gather", "size_bytes": 4096, "count": 1024, "type": "float",
              "algorithm": "native", "codec": "none", "time_us": 1.0, "algbw_gbps": 1.0,
              "busbw_gbps": 1.0, "wire_bytes": 1, "rel_err": 0.0, "wrong": 0, "speedup": 1.0,
              "nprocs": 2}  # fmt: skip
_TRAIN_ROW = {"run": "plain", "step_s": 0.1, "eval_loss": 5.0, "wire_bytes": 8.0, "steps": 2,
              "losses": [5.0, 4.0], "step_times": [0.1, 0.1], "tokens_per_s": 1.0,
              "comm_fraction": 0.5, "final_loss": 4.5}  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "written"),
    [
        (["sim", "--nodes", "2", "--json", "r.json", "--markdown", "r.md"], ["r.json", "r.md"]),
        (["codecs", "--codec", "none", "--numel", "8", "--repeats", "1", "--json", "r.json",
          "--markdown", "r.md"], ["r.json", "r.md"]),
        (["bench", "-b", "4K", "-e", "4K", "--json", "r.json", "--markdown", "r.md"],
         ["r.json", "r.md"]),
        (["train", "--compare", "plain", "--out", "out", "--markdown", "r.md"],
         ["out/summary.json", "out/losses.csv", "r.md"]),
    ],
)  # fmt: skip
def test_the_files_are_written_before_a_reader_gone_can_stop_the_command(
    argv, written, tmp_path, monkeypatch
):
    """From a bug hunt: ``commpress train ... | grep -m1 plain`` (standard output unbuffered)
    trained to the end, then lost summary.json, the curves and --markdown to the
    BrokenPipeError of the table printed before them; bench, sim and codecs their --json and
    --markdown alike."""
    from commpress.bench import collectives
    from commpress.train import command

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(collectives, "run_distributed", lambda *a, **k: [[dict(_BENCH_ROW)]])
    monkeypatch.setattr(command, "run_distributed", lambda *a, **k: [[dict(_TRAIN_ROW)]])
    monkeypatch.setattr(sys, "stdout", _ReaderGone())
    with pytest.raises(BrokenPipeError):
        main(argv)
    assert [path for path in written if not (tmp_path / path).is_file()] == []


def test_a_broken_pipe_other_than_standard_output_keeps_its_traceback(monkeypatch, capsys):
    """Only a reader that stopped reading standard output ends a command quietly: another
    broken pipe (a dead peer of a local run, say) is an error to see."""
    from commpress import cli
    from commpress.bench import schedule_command

    def broken(args):
        raise BrokenPipeError("a peer's pipe")

    monkeypatch.setattr(schedule_command, "run", broken)
    with pytest.raises(BrokenPipeError, match="a peer's pipe"):
        cli.main(["schedule", "--op", "all_gather", "--algorithm", "ring", "--world", "2"])


@pytest.mark.parametrize(
    "argv",
    [
        ["cluster", "up", "--hosts", "2", "--link", "1gbit", "--prefix", ""],
        ["launch", "--hosts", "2", "--link", "1gbit", "--prefix", "", "--", "true"],
        ["bench", "--prefix", ""],
        ["train", "--prefix", ""],
    ],
)
def test_an_empty_cluster_prefix_is_refused_not_taken_for_the_default(argv, monkeypatch, capsys):
    """From a bug hunt: ``--prefix ""`` (an unset shell variable) built or ran on the default
    cluster ``cp``, which may be another job's (``cluster down`` and ``status`` refused it)."""
    import commpress.cluster.commands as commands

    def touched(*args, **kwargs):
        raise AssertionError("a cluster was built or looked for")

    monkeypatch.setattr(commands, "cluster_for", touched)
    monkeypatch.setattr(commands, "Emulated", touched)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "argument --prefix: prefix must be" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["sim"],
        ["bench", "-b", "1K", "-e", "1K", "-n", "1", "--nprocs", "2", "--algorithm", "native"],
    ],
)
def test_plot_without_matplotlib_is_refused_before_the_run(argv, tmp_path, monkeypatch, capsys):
    """From a bug hunt: the sweep ran to its end, then failed at the plot with exit status 2."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--plot", str(tmp_path / "plot.png")])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert "argument --plot" in captured.err and "needs matplotlib" in captured.err
    assert captured.out == ""


def test_codec_lists_keep_the_options_of_a_spec_together(tmp_path):
    """From a bug hunt: ``--codec int8:block=128,stochastic=true`` was cut at every comma,
    so ``stochastic=true`` was an unknown codec, and a spec of two options (or
    ``auto:max_rel_err=1e-2,codecs=int8+int4``) could not be swept at all."""
    path = tmp_path / "rows.json"
    argv = ["sim", "--nodes", "4", "--size", "1M", "--codec", "int8:block=128,stochastic=true,int4"]
    assert main([*argv, "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [row["codec"] for row in rows] == ["int8:block=128,stochastic=true", "int4"]
    from commpress.bench.arguments import spec_list

    assert spec_list(" int4,auto:max_rel_err=0.01,codecs=int8") == [
        "int4",
        "auto:max_rel_err=0.01,codecs=int8",
    ]


def test_an_auto_codec_keeps_candidates_that_have_options_of_their_own():
    """From a bug hunt: ``bench --codec auto:max_rel_err=1e-2,codecs=int8+zfp:rate=8`` (a
    spec the tuner takes) was cut at ``codecs=...``, refused as an unknown codec."""
    from commpress.bench.arguments import spec_list

    auto = "auto:max_rel_err=1e-2,codecs=int8+zfp:rate=8"
    assert spec_list(f"{auto},int4") == [auto, "int4"]
    assert spec_list("auto:codecs=int8:block=128+int4,none") == [
        "auto:codecs=int8:block=128+int4",
        "none",
    ]
    assert spec_list("zfp:rate=8,int8:block=128,stochastic=true") == [
        "zfp:rate=8",
        "int8:block=128,stochastic=true",
    ]


@pytest.mark.parametrize("argv", [["sim"], ["codecs", "--codec", "none", "--numel", "8"]])
def test_two_outputs_naming_one_file_are_refused(argv, tmp_path, capsys):
    """From a bug hunt: ``--json r --markdown r`` wrote the JSON, then the markdown over it."""
    path = tmp_path / "out"
    assert main([*argv, "--json", str(path), "--markdown", f"{tmp_path}/./out"]) == 2
    assert "--json and --markdown name the same file" in capsys.readouterr().err
    assert not path.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sim", "--calibrate", "{read}", "--save-fit", "{read}"],
         "--save-fit names '{read}', which --calibrate reads"),
        (["sim", "--fit", "{read}", "--json", "{read}"],
         "--json names '{read}', which --fit reads"),
        (["sim", "--codec-speeds", "{read}", "--markdown", "{read}"],
         "--markdown names '{read}', which --codec-speeds reads"),
        (["bench", "--algorithm", "auto", "--tune-fit", "{read}", "--json", "{read}"],
         "--json names '{read}', which --tune-fit reads"),
    ],
)  # fmt: skip
def test_an_output_naming_a_file_the_command_reads_is_refused(argv, message, tmp_path, capsys):
    """From a bug hunt: ``sim --calibrate b.json --save-fit b.json`` replaced the measured
    rows with the fit, and ``--fit f.json --json f.json`` the fit with the rows, exit 0."""
    read = tmp_path / "measured.json"
    read.write_text("kept")
    argv = [word.format(read=read) for word in argv]
    assert main(argv) == 2
    assert message.format(read=read) in capsys.readouterr().err
    assert read.read_text() == "kept"


@pytest.mark.parametrize("command", ["bench", "train"])
def test_nprocs_is_refused_past_the_most_local_processes(command, monkeypatch, capsys):
    """``bench --nprocs 1025`` forked 1025 ranks (on 2 cores) before anything failed."""
    from commpress.bench import collectives
    from commpress.train import command as train

    for module in (collectives, train):
        monkeypatch.setattr(module, "run_distributed", lambda *a, **k: pytest.fail("forked"))
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--nprocs", "255"])
    assert exit_info.value.code == 2
    assert "argument --nprocs: 255 local processes: at most 254" in capsys.readouterr().err


def test_launch_refuses_more_ranks_per_host_than_local_processes(monkeypatch, capsys):
    """``launch --nproc-per-host 100000000`` was taken: the launcher would start a rank
    after another on this machine's cores, every host's, until something gave out."""
    from commpress.cluster import commands

    monkeypatch.setattr(commands, "cluster_from", lambda args: pytest.fail("cluster used"))
    with pytest.raises(SystemExit) as exit_info:
        main(["launch", "--hosts", "2", "--link", "1gbit", "--nproc-per-host", "255", "--", "true"])
    assert exit_info.value.code == 2
    assert "argument --nproc-per-host: '255': must be in [1, 254]" in capsys.readouterr().err


def test_launch_refuses_more_ranks_in_all_than_local_processes(monkeypatch, capsys):
    """Each host's count was bounded, not their product: 254 hosts of 254 ranks were taken,
    64516 processes on this machine. Refused before a cluster is built for the job, and for
    a cluster that is up."""
    from commpress.cluster import commands

    monkeypatch.setattr(commands, "cluster_from", lambda args: pytest.fail("cluster used"))
    argv = ["launch", "--hosts", "254", "--link", "1gbit", "--nproc-per-host", "2", "--", "true"]
    assert main(argv) == 2
    assert "--nproc-per-host 2 on 254 hosts is 508 ranks" in capsys.readouterr().err

    class Up:  # a cluster of 128 hosts that is up
        hosts = 128

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(commands, "cluster_from", lambda args: Up())
    assert main(["launch", "--nproc-per-host", "2", "--", "true"]) == 2
    assert "256 ranks, all on this machine: at most 254" in capsys.readouterr().err


def _options_of(parser, path: str):
    """Every (command path, option) of ``parser`` and its subcommands, depth first."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield from _options_of(command, f"{path} {name}".strip())
        elif action.option_strings and action.dest not in ("help", "version"):
            yield path, action


@pytest.mark.parametrize("command", sorted(__import__("commpress.cli").cli.COMMANDS))
def test_every_option_of_every_command_says_what_it_does(command):
    """``train --strategy``, ``bench --op/--json/--markdown``, ``sim --json/--markdown``,
    ``schedule --op/--dtype`` and ``codecs --seed`` were listed in --help with no word."""
    from commpress import cli

    options = list(_options_of(cli.build_parser([command]), ""))
    assert any(path.split()[0] == command for path, _ in options)
    assert [(path, a.option_strings) for path, a in options if not a.help] == []


@pytest.mark.parametrize(("command", "option"), [("bench", "--timeout"), ("launch", "--port")])
def test_an_option_with_a_default_names_it_in_its_help(command, option):
    """From a bug hunt: ``bench --timeout`` (1800 s) and ``launch --port`` (29500) were the
    only options with a default that --help did not give."""
    from commpress import cli

    (action,) = [a for _, a in _options_of(cli.build_parser([command]), "")
                 if option in a.option_strings]  # fmt: skip
    assert f"({action.default:g})" in action.help


@pytest.mark.parametrize(
    ("option", "accepted"),
    [("--hosts", "1 to 254"), ("--link", "1mbit to 10tbit"), ("--uplink", "kbit, mbit, gbit"),
     ("--delay", "at most 274877906us"), ("--mtu", "576 to 65535"),
     ("--prefix", "1-6 lowercase letters or digits")],
)  # fmt: skip
@pytest.mark.parametrize("command", ["cluster", "launch", "bench", "train"])
def test_a_cluster_option_names_the_values_it_takes(command, option, accepted):
    """From a bug hunt: ``--hosts`` said only 'number of hosts', ``--mtu`` 'MTU of every
    link', ``--link`` gave examples but not the units or range the cluster takes."""
    from commpress import cli

    helps = [a.help for _, a in _options_of(cli.build_parser([command]), "")
             if option in a.option_strings]  # fmt: skip
    assert helps and all(accepted in text for text in helps)


def test_launch_help_says_which_cluster_the_job_runs_on():
    from commpress import cli

    (commands,) = [a for a in cli.build_parser(["launch"])._actions if a.dest == "command"]
    launch = commands.choices["launch"]
    assert "named --prefix that is up" in launch.description
    assert "given --hosts and --link, of one built for the job" in launch.description


def test_train_strategy_says_what_each_runs():
    """``commpress train --help`` listed ``--strategy {fsdp,ddp}`` with no word on either."""
    from commpress import cli

    options = [a for path, a in _options_of(cli.build_parser(["train"]), "") if path == "train"]
    (strategy,) = (action.help for action in options if "--strategy" in action.option_strings)
    assert "fsdp: FSDP2" in strategy and "ddp: DistributedDataParallel" in strategy


@pytest.mark.parametrize(
    "argv",
    [
        ["launch", "--prefix", "cpnone", "--", "true"],
        ["launch", "--prefix", "cpnone", "--hosts", "2", "--", "true"],
        ["bench", "--prefix", "cpnone", "-b", "1K", "-e", "1K", "-n", "1"],
        ["train", "--prefix", "cpnone", "--steps", "1"],
    ],
)
def test_a_cluster_that_is_not_up_is_a_run_time_failure_saying_how_to_start_one(
    argv, monkeypatch, capsys
):
    """From a bug hunt: ``launch``/``bench --prefix X`` without cluster ``X`` up exited with
    status 2, a usage error, for a command that is right once the cluster is up."""
    import commpress.cluster.emulated as emulated

    monkeypatch.setattr(emulated, "present", lambda layout: [])
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "no cluster named 'cpnone' is up: start one with `commpress cluster up --prefix" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [["sim", "--fit", "{missing}"], ["sim", "--codec-speeds", "{folder}"],
     ["sim", "--calibrate", "{file}", "{missing}"],
     ["bench", "--algorithm", "auto", "--tune-fit", "{missing}"]],
)  # fmt: skip
def test_an_input_file_that_is_not_there_is_refused_naming_its_option(argv, tmp_path, capsys):
    """From a bug hunt: ``sim --fit missing.json`` said 'cannot read missing.json: No such
    file or directory', naming no option (which of --fit, --calibrate, --codec-speeds?)."""
    (tmp_path / "file.json").write_text("{}")
    paths = {"missing": tmp_path / "no.json", "folder": tmp_path, "file": tmp_path / "file.json"}
    argv = [word.format(**paths) for word in argv]
    option = next(word for word in reversed(argv) if word.startswith("--"))
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert f"error: argument {option}: '{argv[-1]}'" in err
    assert err.endswith(("no such file", "is a folder, not a file"))


def test_codecs_takes_a_comma_list_of_specs_as_bench_and_sim_do(tmp_path):
    """From a bug hunt: ``codecs --codec int8,int4``, written as ``bench --codec`` takes
    it, failed with 'unknown codec 'int8,int4''."""
    path = tmp_path / "rows.json"
    argv = ["codecs", "--numel", "64", "--repeats", "1", "--json", str(path)]
    codecs = ["--codec", "int8:block=32,stochastic=true,int4", "--codec", "none"]
    assert main([*argv, *codecs]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [row["codec"] for row in rows] == ["int8:block=32,stochastic=true", "int4", "none"]


def test_cluster_status_of_a_prefix_not_up_says_how_to_start_that_one(monkeypatch, capsys):
    """From a bug hunt: ``cluster status --prefix lab`` said 'start one with `commpress
    cluster up`', which starts the cluster ``cp``, not ``lab``."""
    import commpress.cluster.commands as commands

    monkeypatch.setattr(commands, "present", lambda layout: [])
    assert main(["cluster", "status", "--prefix", "lab"]) == 1
    assert "start one with `commpress cluster up --prefix lab " in capsys.readouterr().err


def test_codecs_refuses_a_numel_whose_run_cannot_fit_in_memory(capsys):
    """From a bug hunt: ``codecs --numel 100000000000`` ended in torch's traceback,
    'DefaultCPUAllocator: can't allocate memory'."""
    with pytest.raises(SystemExit) as exit_info:
        main(["codecs", "--codec", "none", "--numel", str(10**15), "--repeats", "1"])
    assert exit_info.value.code == 2
    assert f"argument --numel: '{10**15}': a run holds about" in capsys.readouterr().err


def test_an_option_the_cluster_up_does_not_match_is_a_run_time_failure(monkeypatch, capsys):
    """From a bug hunt: ``launch --hosts 3`` with a cluster of 4 hosts up exited 2, a usage
    error, where ``cluster up`` of a cluster already up exits 1: the same command line is
    right once that cluster is down."""
    import commpress.cluster.emulated as emulated

    class Up:
        hosts = 4

    monkeypatch.setattr(emulated, "present", lambda layout: ["cpup-h0"])
    monkeypatch.setattr(emulated.Emulated, "attach", lambda prefix: Up())
    assert main(["launch", "--prefix", "cpup", "--hosts", "3", "--", "true"]) == 1
    assert "hosts=3 but cluster 'cpup' is up with 4 hosts" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "spec"),
    [(["bench", "--codec", "int4,int8:block=0"], "int8:block=0"),
     (["sim", "--codec", "zfp:rate=99"], "zfp:rate=99"),
     (["schedule", "--op", "all_gather", "--algorithm", "ring", "--world", "2", "--codec",
       "int4:block=0"], "int4:block=0")],
)  # fmt: skip
def test_a_codec_option_out_of_range_names_its_spec(argv, spec, capsys):
    """From a bug hunt: ``bench --codec int4,int8:block=0`` said only 'block must be a
    positive int of at most 16777216, got 0', not which of the specs had it."""
    assert main(argv) == 2
    assert f"error: --codec: codec spec {spec!r}: " in capsys.readouterr().err


def test_a_low_rank_option_out_of_range_names_its_spec(capsys):
    """From a bug hunt: ``train --compare plain powersgd:rank=0`` said only 'rank must be an
    int of at least 1, got 0'."""
    argv = ["train", "--strategy", "ddp", "--compare", "plain", "powersgd:rank=0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: --compare: low-rank spec 'powersgd:rank=0': rank must be" in err


def test_version_says_which_commpress_torch_and_python_run(capsys):
    """`commpress --version` said 'the following arguments are required: COMMAND'."""
    import platform

    import torch

    import commpress

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    said = capsys.readouterr().out.strip()
    assert said == (
        f"commpress {commpress.__version__}, torch {torch.__version__}, "
        f"Python {platform.python_version()}"
    )
    code = "import sys\nfrom commpress.cli import main\ntry:\n    main(['--version'])\n"
    code += "except SystemExit:\n    print(*sys.modules)"
    modules = _run(code).splitlines()[-1].split()
    assert "commpress.cli" in modules and "torch" not in modules  # read, not imported


def test_python_dash_m_commpress_runs_the_command_line():
    """``python -m commpress`` is ``commpress``: a newcomer's first try said 'No module named
    commpress.__main__; 'commpress' is a package and cannot be directly executed'."""

    def python_m_commpress(*argv: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "commpress", *argv]
        return subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)

    typo = python_m_commpress("shedule")
    assert typo.returncode == 2
    assert "invalid choice: 'shedule'" in typo.stderr
    assert typo.stderr.startswith("usage: commpress ")
    helped = python_m_commpress("--help")
    assert helped.returncode == 0
    assert helped.stdout.startswith("usage: commpress [-h] [--version] COMMAND")


def test_codecs_numel_help_spells_its_default_as_the_option_takes_it():
    """``--numel``'s help said 'default: 16M = 64 MiB', and ``--numel 16M`` was refused:
    'not a whole number'."""
    import re

    from commpress.cli import build_parser

    parser = build_parser(["codecs"])
    codecs = next(a for a in parser._actions if a.dest == "command").choices["codecs"]
    numel = next(a for a in codecs._actions if a.dest == "numel")
    shown = re.search(r"default: ([^\s,;)=]+)", numel.help).group(1)
    assert codecs.parse_args(["--numel", shown]).numel == numel.default


@pytest.mark.parametrize(
    "argv, option",
    [
        (["codecs", "--codec", "none,int9"], "--codec"),
        (["bench", "--nprocs", "2", "--codec", "int8:block=0"], "--codec"),
        (
            [
                "schedule",
                "--op",
                "all_gather",
                "--algorithm",
                "ring",
                "--world",
                "2",
                "--codec",
                "INT8",
            ],
            "--codec",
        ),  # fmt: skip
        (["sim", "--codec", "int8,int9"], "--codec"),
        (["sim", "--codec", "int8:blok=4"], "--codec"),
        (["train", "--compare", "plain", "int9"], "--compare"),
        (["train", "--strategy", "ddp", "--compare", "powersgd:rnk=4"], "--compare"),
    ],
)
def test_a_bad_codec_spec_is_an_error_naming_its_option(argv, option, capsys):
    """'unknown codec 'int9' in spec 'int9'' named no option: which of a command's values was
    wrong was left to the reader."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"error: {option}" in err, err


def test_train_dim_and_heads_that_do_not_divide_name_both_options(capsys):
    """``train --heads 3`` said 'dim (128) must be a multiple of heads (3)', the model's
    field names, not the options."""
    assert main(["train", "--heads", "3"]) == 2
    err = capsys.readouterr().err
    assert "error: --dim 128 must be a multiple of --heads 3" in err, err
