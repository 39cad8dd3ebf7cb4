"""``run_on_cluster(cluster, fn, *args)``: a Python function on every host, results back.

The cluster counterpart of :func:`commpress.cluster.local.run_distributed`:
one gloo rank per host, launched by :mod:`commpress.cluster.launcher`, joined over
the emulated links. ``fn`` and its arguments travel by pickle through a scratch
folder (the namespaces share the file system); so do results and tracebacks. An ``fn``
defined in the script being run (``__main__``) is found as multiprocessing's spawn finds
it: each rank imports that script first, without running its ``if __name__ ==
"__main__"`` block.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import runpy
import sys
import tempfile
import traceback
import types
from pathlib import Path
from typing import Any

import torch

from commpress.cluster.local import DistributedError
from commpress.cluster.rank import run_rank
from commpress.cluster.system import IMPORTING_SCRIPT, check_not_importing_script


def main_of_script(path: str, *args: Any) -> Any:
    """``main(*args)`` of the script at ``path``, imported as a module of its own name: run
    directly, a script is ``__main__``, whose functions the ranks cannot unpickle by
    reference (``if __name__ == "__main__": sys.exit(main_of_script(__file__))``)."""
    directory, name = os.path.split(os.path.abspath(path))
    sys.path.insert(0, directory)  # the ranks find it there too: they inherit sys.path
    return importlib.import_module(name.removesuffix(".py")).main(*args)


def run_on_cluster(cluster, fn, *args: Any, timeout: float = 300.0) -> list[Any]:
    check_not_importing_script("a job is being run on the cluster")
    with tempfile.TemporaryDirectory(prefix="commpress-cluster-") as scratch:
        job = Path(scratch)
        if getattr(fn, "__module__", None) == "__main__":
            # the ranks import the caller's script first, as multiprocessing's spawn does
            (job / "main.json").write_text(json.dumps(_main_script(fn)))
        (job / "job.pkl").write_bytes(pickle.dumps((fn, args, timeout)))
        status = cluster.launch(
            [sys.executable, "-m", "commpress.cluster.jobs", scratch],
            timeout=timeout,
            output=sys.stderr,
            env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},  # find fn's module
        )
        errors = sorted(job.glob("*.err"))
        if errors:
            raise DistributedError(
                "\n".join(f"rank {e.stem} failed:\n{e.read_text()}" for e in errors)
            )
        if status != 0:
            raise DistributedError(f"the job on {cluster.describe()} ended with status {status}")
        return [torch.load(job / f"{rank}.pt", weights_only=False) for rank in range(cluster.hosts)]


def _main_script(fn) -> dict:
    """How a rank finds the script that defines ``fn`` in ``__main__``: by module name
    (``python -m package.script``) or by path."""
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name != "__main__":
        return {"name": spec.name}
    path = getattr(main, "__file__", None)
    if path is None:
        raise ValueError(
            f"fn={fn.__qualname__} is defined in an interactive session, which the hosts "
            "cannot import: define it in a module or a script"
        )
    return {"path": os.path.abspath(path)}


def _import_as_main(script: dict) -> None:
    """Run the caller's script as the module ``__mp_main__`` (its ``if __name__ ==
    "__main__"`` block does not run) and make it ``__main__``, where pickle looks up the
    functions it defined."""
    os.environ[IMPORTING_SCRIPT] = "1"
    try:
        if "name" in script:
            names = runpy.run_module(script["name"], run_name="__mp_main__", alter_sys=True)
        else:
            names = runpy.run_path(script["path"], run_name="__mp_main__")
    finally:
        del os.environ[IMPORTING_SCRIPT]
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(names)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


def _main(scratch: str) -> int:
    job = Path(scratch)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    try:
        if (job / "main.json").exists():
            _import_as_main(json.loads((job / "main.json").read_text()))
        fn, args, timeout = pickle.loads((job / "job.pkl").read_bytes())
        value = run_rank(fn, args, rank, world_size, backend="gloo", init_method="env://",
                         timeout=timeout)  # fmt: skip
        (job / f"{rank}.pt").write_bytes(value)
        return 0
    except BaseException:
        (job / f"{rank}.err").write_text(traceback.format_exc())
        return 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
