"""The README's and ``docs/``'s examples run as written: their self-contained python blocks,
and the ``commpress`` command lines of their console blocks print what the page shows; the
names, options and files they mention exist."""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import shlex
from pathlib import Path

import pytest

from commpress.cli import COMMANDS, EXIT_STATUSES, build_parser, main

README = Path(__file__).resolve().parents[2] / "README.md"
#: The README and the documentation it links to: every check below reads them all.
PAGES = [README, *sorted((README.parent / "docs").glob("*.md"))]
FENCE = re.compile(r"^ *```(\w+)\n(.*?)^ *```", re.S | re.M)

# Blocks that need what a unit test has not, told apart by a line of their own; each must
# still be in a page (checked), and every other python block is run.
NOT_SELF_CONTAINED = {
    "world = dist.get_world_size()": "a process group",
    "cp.fsdp.compress(model,": "an FSDP2 model and a process group",
    "cp.lowrank.ddp_hook(algorithm,": "a DDP model and a process group",
    "with Emulated(hosts=4,": "root and an emulated cluster",
}


def pages_text() -> str:
    return "\n".join(page.read_text() for page in PAGES)


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(pages_text()) if lang == language]


def test_the_readme_links_every_page_of_the_documentation():
    assert len(PAGES) >= 8
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in README.read_text(), page.name


def self_contained(block: str) -> bool:
    return not any(marker in block for marker in NOT_SELF_CONTAINED)


def shown_values(block: str) -> list[tuple[str, object]]:
    """(expression, value) for each line ``EXPRESSION  # LITERAL``: the page shows what
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
        assert any(marker in block for block in python), marker


@pytest.mark.parametrize("block", [b for b in blocks("python") if self_contained(b)])
def test_self_contained_python_block_runs_and_shows_what_it_gives(block):
    namespace = {"__name__": "readme_example"}
    exec(compile(block, "README.md or docs/", "exec"), namespace)
    for expression, value in shown_values(block):
        assert eval(expression, namespace) == value, expression


@pytest.mark.parametrize("block", blocks("console"))
def test_console_block_prints_what_the_readme_shows(block, capsys):
    command, *shown = block.splitlines()
    assert command.startswith("$ commpress ")
    assert main(shlex.split(command)[2:]) in (0, None)
    assert capsys.readouterr().out.splitlines() == shown


def readme_command_lines() -> list[str]:
    """Every ``commpress ...`` command of the pages' bash blocks (continuation lines
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


def section(title: str) -> str:
    """The text of the README's ``## title`` section, up to the next ``## ``."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def table_rows(text: str) -> list[list[str]]:
    """The cells of every row of the markdown tables in ``text`` (header and rule left out)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[-| ]+\|", line):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows[1:] if rows else rows


def test_the_layout_table_names_every_part_of_the_package_in_its_layer():
    """The "Layout" table, bottom layer first, against the layers tests/unit/test_layers.py
    enforces: a module added to a layer (or moved to another) must be named in its row."""
    from test_layers import LAYERS, ROOT, TESTING, top_level_parts

    rows = table_rows(section("Layout"))
    named = [
        {name.removesuffix("/").removesuffix(".py") for name in re.findall(r"`([^`]+)`", package)}
        for _, package, _ in rows
    ]
    assert named == [set(parts) - {ROOT} for parts in LAYERS]
    assert TESTING in top_level_parts() and f"`{TESTING}/`" in section("Layout")


def prose() -> str:
    """The pages without their fenced blocks, on one line (a code span may wrap)."""
    return re.sub(r"\s*\n\s*", " ", FENCE.sub("", pages_text()))


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option of ``parser`` and of its subcommands (``cluster up``'s too)."""
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action.choices, dict):  # subcommands
            for subparser in action.choices.values():
                found |= option_strings(subparser)
    return found


def inline_command_spans() -> list[str]:
    """The prose's code spans that are a ``commpress COMMAND ...`` line (``[--codec
    SPEC]`` and ``A|B`` included: they are read for option names, not run)."""
    return [
        span
        for span in re.findall(r"`([^`]+)`", prose())
        if span.split()[0] == "commpress" and len(span.split()) > 1 and span.split()[1] in COMMANDS
    ]


def test_the_prose_has_inline_command_lines():
    assert len(inline_command_spans()) >= 10


@pytest.mark.parametrize("span", inline_command_spans())
def test_every_option_an_inline_command_line_names_is_its_commands(span):
    """``commpress bench --roots K ...`` in a sentence: each option named is one of that
    command's (an option renamed or dropped, and the prose left behind, fails here)."""
    name = span.split()[1]
    command = {a.dest: a for a in build_parser([name])._actions}["command"].choices[name]
    named = re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", span)
    assert [option for option in named if option not in option_strings(command)] == []


#: Names of the form ``commpress.x`` in the pages that are no Python names.
NOT_PYTHON_NAMES = {"commpress.tuner": "the autotuner's logger"}


def api_names() -> list[str]:
    """Every ``cp.a.b`` or ``commpress.a.b`` the pages name (prose and code alike)."""
    found = re.findall(r"(?<![\w./-])((?:cp|commpress)(?:\.[A-Za-z_]\w*)+)", pages_text())
    return sorted(set(found) - set(NOT_PYTHON_NAMES))


def test_the_readme_names_the_api():
    assert len(api_names()) >= 20
    for name in NOT_PYTHON_NAMES:  # each exemption still needed
        assert name in pages_text(), name


@pytest.mark.parametrize("name", api_names())
def test_every_api_name_of_the_readme_exists(name):
    """``cp.fsdp.compress``, ``commpress.collectives.auto.KEPT_CHOICES``: a module,
    function or constant renamed or removed, and the page left behind, fails here."""
    parts = ["commpress", *name.split(".")[1:]]
    obj = importlib.import_module("commpress")
    for depth, part in enumerate(parts[1:], start=2):
        try:
            obj = getattr(obj, part)
        except AttributeError:  # a submodule its package does not import (or no such name)
            obj = importlib.import_module(".".join(parts[:depth]))


REPOSITORY = README.parent
#: A path of the repository in a code span: ``benchmarks/x/README.md``,
#: ``tests/unit/test_x.py::test_y``, ``benchmarks/lowrank_accuracy_*``.
REPOSITORY_PATH = re.compile(r"`((?:benchmarks|src|tests|\.ci)/[^`\s]*)`")


def repository_paths() -> list[str]:
    found = set(REPOSITORY_PATH.findall(pages_text()))
    # the "file" column of the headline results' table names files in benchmarks/
    results = section("Results")
    results = results[results.index("| what | result | file |") :]
    for row in table_rows(results.split("\n\n")[0]):
        found.update(f"benchmarks/{name}" for name in re.findall(r"`([^`]+)`", row[-1]))
    return sorted(found)


def test_the_readme_names_files_of_the_repository():
    assert len(repository_paths()) >= 40


@pytest.mark.parametrize("path", repository_paths())
def test_every_file_the_readme_names_exists(path):
    """A benchmark's record, a test (down to its name after ``::``) or a source file the
    pages point to: moved or renamed, and the page left behind, fails here."""
    file, _, test = path.partition("::")
    assert sorted(REPOSITORY.glob(file)) if "*" in file else (REPOSITORY / file).exists()
    if test:
        assert re.search(rf"^\s*def {re.escape(test)}\(", (REPOSITORY / file).read_text(), re.M)


def test_the_exit_statuses_are_those_commpress_help_lists():
    """ "Every command exits 0 when done, 2 on ..." against ``commpress --help``'s list."""
    sentence = re.search(r"Every command exits (.*?)\. ", prose()).group(1)
    readme = {int(code) for code in re.findall(r"(?<![\w.-])(\d+) (?:when|on)\b", sentence)}
    listed = {int(code) for code in re.findall(r"^  (\d+) ", EXIT_STATUSES, re.M)}
    assert readme == listed


#: A markdown link to a page of the repository: ``[text](docs/codecs.md)``,
#: ``[text](../README.md#results "title")``, a reference ``[ref]: docs/codecs.md``; web
#: addresses (a scheme's ``:``) are not checked.
LINK = re.compile(r"\]\(([^)\s:]+)(?:\s+\"[^\"]*\")?\)|^ *\[[^\]]+\]: *([^\s:]+)\s*$", re.M)
#: Any fenced block, with or without a language: its lines are no headings.
ANY_FENCE = re.compile(r"^ *```.*?^ *```", re.S | re.M)


def anchors(page: Path) -> set[str]:
    """The anchors a markdown renderer gives ``page``'s headings: ``## What has run on a
    GPU`` is ``#what-has-run-on-a-gpu``."""
    titles = re.findall(r"^#+ (.+)$", ANY_FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w -]", "", title.lower()).replace(" ", "-") for title in titles}


def page_links() -> list[tuple[str, str]]:
    text = {page: ANY_FENCE.sub("", page.read_text()) for page in PAGES}
    return [(page.name, a or b) for page in PAGES for a, b in LINK.findall(text[page])]


def test_the_pages_link_to_each_other():
    assert len(page_links()) >= 10


@pytest.mark.parametrize(("page", "link"), page_links())
def test_every_link_of_a_page_leads_to_a_page_and_heading_that_exist(page, link):
    source = next(p for p in PAGES if p.name == page)
    target, _, anchor = link.partition("#")
    path = (source.parent / target).resolve() if target else source
    assert path.exists(), link
    if anchor:
        assert anchor in anchors(path), link
