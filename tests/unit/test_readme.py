"""README.md's examples run as written: its self-contained python blocks, and the
``commpress`` command lines of its console blocks print what the README shows."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from commpress.cli import COMMANDS, build_parser, main

README = Path(__file__).resolve().parents[2] / "README.md"
FENCE = re.compile(r"^ *```(\w+)\n(.*?)^ *```", re.S | re.M)

# Blocks that need what a unit test has not, told apart by a line of their own; each must
# still be in the README (checked), and every other python block is run.
NOT_SELF_CONTAINED = {
    "world = dist.get_world_size()": "a process group",
    "cp.fsdp.compress(model,": "an FSDP2 model and a process group",
    "cp.lowrank.ddp_hook(algorithm,": "a DDP model and a process group",
    "with Emulated(hosts=4,": "root and an emulated cluster",
}


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def self_contained(block: str) -> bool:
    return not any(marker in block for marker in NOT_SELF_CONTAINED)


def shown_values(block: str) -> list[tuple[str, object]]:
    """(expression, value) for each line ``EXPRESSION  # LITERAL``: the README shows what
    the expression gives."""
    shown = []
    for line in block.splitlines():
        code, _, comment = line.partition("#")
        try:
            ast.parse(code.strip(), mode="eval")
            value = ast.literal_eval(comment.strip())
        except (SyntaxError, ValueError):
            continue
        shown.append((code.strip(), value))
    return shown


def test_every_python_block_that_needs_more_than_python_is_still_there():
    python = blocks("python")
    for marker in NOT_SELF_CONTAINED:
        assert sum(marker in block for block in python) == 1, marker


@pytest.mark.parametrize("block", [b for b in blocks("python") if self_contained(b)])
def test_self_contained_python_block_runs_and_shows_what_it_gives(block):
    namespace = {"__name__": "readme_example"}
    exec(compile(block, str(README), "exec"), namespace)
    for expression, value in shown_values(block):
        assert eval(expression, namespace) == value, expression


@pytest.mark.parametrize("block", blocks("console"))
def test_console_block_prints_what_the_readme_shows(block, capsys):
    command, *shown = block.splitlines()
    assert command.startswith("$ commpress ")
    assert main(shlex.split(command)[2:]) in (0, None)
    assert capsys.readouterr().out.splitlines() == shown


def readme_command_lines() -> list[str]:
    """Every ``commpress ...`` command of the README's bash blocks (continuation lines
    joined, the comment and anything before ``commpress`` on its line dropped)."""
    lines = []
    for block in blocks("bash"):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            code = line.partition(" #")[0]
            if "commpress " in code:
                lines.append(code[code.index("commpress ") :].strip())
    return lines


def test_the_readme_has_command_lines_to_parse():
    assert len(readme_command_lines()) >= 10


@pytest.mark.parametrize("line", readme_command_lines())
def test_every_command_line_of_the_readme_is_one_the_parser_takes(line):
    """Parsed only (nothing runs): an option renamed or dropped fails here."""
    parser = build_parser(COMMANDS)
    parser.parse_args(shlex.split(line)[1:])
