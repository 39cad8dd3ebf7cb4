"""Tables, JSON and provenance shared by every benchmark."""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

import commpress


def _cell(value, spec: str) -> str:
    """``value`` formatted; a missing or undefined measurement (:func:`_undefined`) shows as
    ``-``, as :func:`json_value` writes it as null."""
    if _undefined(value):
        return "-"
    return format(value, spec)


def format_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]]) -> str:
    """Right-aligned plain-text table. ``columns``: (key, header, format spec)."""
    cells = [[header for _, header, _ in columns]]
    cells += [[_cell(row[key], spec) for key, _, spec in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells
    )


def markdown_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]]) -> str:
    lines = ["| " + " | ".join(header for _, header, _ in columns) + " |"]
    lines.append("|" + "---:|" * len(columns))
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[k], spec) for k, _, spec in columns) + " |")
    return "\n".join(lines)


def provenance() -> dict[str, str]:
    """What a reader needs to reproduce a figure: command, machine, versions, date."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if "model name" in line)
    except (OSError, StopIteration):
        pass
    return {
        "command": " ".join(["commpress", *map(shlex.quote, sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "versions": (
            f"commpress {commpress.__version__}, torch {torch.__version__}, "
            f"Python {platform.python_version()}"
        ),
        "commit": _commit(),
    }


def _commit() -> str:
    """The commit of the commpress checkout that ran (``+`` when it had uncommitted changes),
    or ``unknown`` (an installed wheel, no git)."""
    where = Path(commpress.__file__).parent
    try:
        run = functools.partial(
            subprocess.run, cwd=where, capture_output=True, text=True, timeout=10, check=True
        )
        commit = run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip()
        dirty = run(["git", "status", "--porcelain", "--untracked-files=no", "."]).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+" if dirty else "")


def publish(rows: Sequence[dict], columns, title: str, args, plot, heading: str = "") -> None:
    """Write what ``--json``, ``--markdown`` and ``--plot`` ask for (``plot(rows, path)``
    draws), then print ``heading`` and the table: the files first, so that a reader of
    standard output that has gone (``| head -1``) cannot cost them."""
    if args.json:
        write_json(args.json, rows)
    if args.markdown:
        write_markdown(args.markdown, title, rows, columns)
    if args.plot:
        plot(rows, args.plot)
    if heading:
        print(heading)
    print(format_table(rows, columns))


def pyplot():
    """matplotlib's pyplot drawing to files (Agg), or an ImportError saying what to install."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'commpress[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_json(path: str | Path, rows: Sequence[dict], **fields) -> None:
    """``rows`` with their provenance, and any other top-level ``fields`` (``where=``...);
    a number that is not finite as null (:func:`json_value`)."""
    record = {**fields, "provenance": provenance(), "rows": list(rows)}
    Path(path).write_text(json.dumps(json_value(record), indent=2, allow_nan=False))


def _undefined(value) -> bool:
    """Whether ``value`` is a float that is not finite: a measurement missing or undefined."""
    return isinstance(value, float) and not math.isfinite(value)


def json_value(value):
    """``value`` with every float that is not finite, at any depth, as None: JSON has no
    NaN or infinity (``json.dumps`` writes ``NaN``, which a strict reader refuses). Such a
    value is a measurement that is missing or undefined: ``bench``'s ``rel_err`` of an
    output holding NaN or an infinity."""
    if _undefined(value):
        return None
    if isinstance(value, dict):
        return {key: json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(item) for item in value]
    return value


def write_markdown(
    path: str | Path, title: str, rows: Sequence[dict], columns, notes: str = ""
) -> None:
    meta = provenance()
    header = "\n".join(
        f"- **{key}**: `{value}`" if key == "command" else f"- **{key}**: {value}"
        for key, value in meta.items()
    )
    body = f"# {title}\n\n{header}\n\n{markdown_table(rows, columns)}\n"
    Path(path).write_text(body + (f"\n{notes.strip()}\n" if notes else ""))
