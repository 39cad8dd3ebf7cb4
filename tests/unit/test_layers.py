"""The package's layers, read from the source with ``ast``: a module imports only from its
own layer and those below it.

    bench, cluster, train, cli, __main__, commpress/__init__     (top: anything)
    integrations, lowrank
    collectives
    sim              (the cost model and the autotuner that the collectives consult)
    transport
    schedules        (codecs, spec_options and units only, never torch.distributed)
    codecs, spec_options, units, ranks, seeds, _torch_private

``commpress.testing`` may import anything, and nothing in the package imports it (only
the tests do). Imports under ``if TYPE_CHECKING:`` do not count; imports inside
functions do. Modules named in a string and imported with ``importlib`` are not seen: only
the top layer does that (``commpress/__init__`` and ``cli``, which may import anything).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "commpress"
ROOT = ""  # the layer name of commpress/__init__.py (and of names imported from it)
LAYERS = (
    ("codecs", "spec_options", "units", "ranks", "seeds", "_torch_private"),
    ("schedules",),
    ("transport",),
    ("sim",),
    ("collectives",),
    ("integrations", "lowrank"),
    ("bench", "cluster", "train", "cli", "__main__", ROOT),
)
LEVEL = {part: level for level, parts in enumerate(LAYERS) for part in parts}
TESTING = "testing"
#: What the schedules may import from the package: they are pure data over the codecs.
SCHEDULES_MAY_IMPORT = {"schedules", "codecs", "spec_options", "units"}


def top_level_parts() -> set[str]:
    """Every subpackage and module directly under commpress/."""
    return {
        path.stem
        for path in PACKAGE.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    }


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of everything ``module`` imports, relative imports resolved.

    ``from a.b import c`` gives ``a.b.c`` (``c`` may be a submodule or a name in
    ``a.b``; for the layers only the part after ``commpress.`` matters).
    """
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.extend((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    anchor = ".".join(parts[: len(parts) - (node.level - 1)])
                    base = f"{anchor}.{base}" if base else anchor
                found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
            visit(ast.iter_child_nodes(node))

    visit(ast.parse(source).body)
    return found


def part_of(name: str, parts: set[str]) -> str | None:
    """The top-level part of commpress that ``name`` lies in; None outside commpress."""
    pieces = name.split(".")
    if pieces[0] != "commpress":
        return None
    if len(pieces) > 1 and pieces[1] in parts:
        return pieces[1]
    return ROOT  # commpress itself, or a name it exports (``from commpress import Codec``)


def violations(module: str, source: str, is_package: bool, parts: set[str]) -> list[str]:
    """What ``module`` imports against the layers, one line each."""
    own = part_of(module, parts)
    found = []
    tree_names = imported_names(source, module, is_package)
    for line, name in tree_names:
        where = f"{module}:{line} imports {name}"
        target = part_of(name, parts)
        if own == "schedules" and (name + ".").startswith("torch.distributed."):
            found.append(f"{where}: the schedules must not touch torch.distributed")
        if target is None or target == own or own == TESTING:
            continue
        if target == TESTING:
            found.append(f"{where}: only commpress.testing and the tests import it")
        elif own == "schedules" and target not in SCHEDULES_MAY_IMPORT:
            found.append(f"{where}: the schedules import only codecs, spec_options and units")
        elif LEVEL[target] > LEVEL[own]:
            found.append(f"{where}: {target or 'commpress'} is above {own or 'commpress'}")
    if own == "schedules":  # ``import torch`` alone reaches it too
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "distributed"
                and isinstance(node.value, ast.Name)
                and node.value.id == "torch"
            ):
                found.append(f"{module}:{node.lineno} uses torch.distributed")
    return found


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        dotted = ".".join(relative.parts)
        found.append((dotted.removesuffix(".__init__"), path))
    return found


def test_every_part_of_the_package_has_a_layer():
    assert top_level_parts() == set(LEVEL) - {ROOT} | {TESTING}


def test_the_package_respects_its_layers():
    parts = top_level_parts()
    found = []
    imports = 0
    for module, path in modules():
        source = path.read_text()
        imports += len(imported_names(source, module, path.name == "__init__.py"))
        found += violations(module, source, path.name == "__init__.py", parts)
    assert imports > 100  # the scan did read the package
    assert found == [], "\n".join(found)


def test_the_scan_sees_the_imports_that_exist():
    """Known edges, each form of import once: absolute, a name of a package, lazy."""
    parts = top_level_parts()
    edges = set()
    for module, path in modules():
        for _, name in imported_names(path.read_text(), module, path.name == "__init__.py"):
            if part_of(name, parts) is not None:
                edges.add((part_of(module, parts), part_of(name, parts)))
    assert {
        ("collectives", "schedules"),  # from commpress.schedules import ...
        ("codecs", "_torch_private"),  # from commpress import _torch_private
        ("train", "integrations"),  # inside a function
        ("schedules", "codecs"),
        ("cli", "cluster"),
    } <= edges


FAKE = """
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import distributed

from . import alltoall
from ..transport import p2p

if TYPE_CHECKING:
    from commpress.bench import report
else:
    import commpress.testing


def lazy():
    from commpress.schedules.ring import all_gather
    from commpress import collectives

    return torch.distributed.get_rank()
"""


def test_the_checker_catches_violations():
    found = violations("commpress.schedules.fake", FAKE, False, top_level_parts())
    assert [line.split(": ", 1)[0] for line in found] == [
        "commpress.schedules.fake:7 imports torch.distributed",
        "commpress.schedules.fake:10 imports commpress.transport.p2p",
        "commpress.schedules.fake:15 imports commpress.testing",
        "commpress.schedules.fake:20 imports commpress.collectives",
        "commpress.schedules.fake:22 uses torch.distributed",
    ]  # not the TYPE_CHECKING import of bench, nor the schedules' own modules
    # a layer below what it imports, by a relative import from a package's __init__
    source = "from ..integrations import ddp\n"
    found = violations("commpress.transport", source, True, top_level_parts())
    assert found == [
        "commpress.transport:1 imports commpress.integrations.ddp: integrations is above transport"
    ]


@pytest.mark.parametrize(
    "module, is_package, source, imported",
    [
        ("commpress.a.b", False, "from . import c", "commpress.a.c"),
        ("commpress.a.b", False, "from .. import c", "commpress.c"),
        ("commpress.a", True, "from .b import c", "commpress.a.b.c"),
        ("commpress.a", True, "from ..b import c", "commpress.b.c"),
    ],
)
def test_relative_imports_resolve_against_the_package(module, is_package, source, imported):
    assert imported_names(source, module, is_package) == [(1, imported)]


def _calls_without_a_mesh(source: str) -> list[int]:
    """Lines of ``fully_shard(...)`` calls in ``source`` that name no ``mesh``."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "fully_shard"
        and not any(keyword.arg == "mesh" for keyword in node.keywords)
    ]


def test_every_fully_shard_of_ours_names_its_mesh():
    """Without one, FSDP2 shards on the accelerator whenever one is visible, and our CPU
    models fail on a GPU machine (``cp.fsdp.cpu_mesh``)."""
    assert _calls_without_a_mesh("fully_shard(model)\nfully_shard(block, mesh=m)") == [1]
    root = PACKAGE.parents[1]
    found = {
        str(path.relative_to(root)): lines
        for folder in ("src", "tests", "benchmarks")
        for path in sorted((root / folder).rglob("*.py"))
        if (lines := _calls_without_a_mesh(path.read_text()))
    }
    assert found == {}
