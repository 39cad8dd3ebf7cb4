"""``run_on_cluster(cluster, fn, *args)``: a Python function on every host, results back.

The cluster counterpart of :func:`commpress.cluster.local.run_distributed`, and built on
it: one gloo rank per host, forked from the same server (torch and commpress imported
once, not once per rank and job), each moved into its host's network namespace before it
starts (:func:`~commpress.cluster.system.enter_namespace`: what ``ip netns exec`` does
but for ``/sys``),
with the variables :mod:`commpress.cluster.launcher` gives a rank of a job; the ranks
meet through a file store and talk over the emulated links. An ``fn`` defined in the
script being run (``__main__``) is found as multiprocessing finds it: each rank imports
that script first, without running its ``if __name__ == "__main__"`` block.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from commpress.cluster.launcher import DEFAULT_PORT, rank_environment
from commpress.cluster.local import DistributedError, run_ranks
from commpress.cluster.system import check_not_importing_script


def main_of_script(path: str, *args: Any) -> Any:
    """``main(*args)`` of the script at ``path``, imported as a module of its own name, so
    that its functions reach the ranks by reference under that name
    (``if __name__ == "__main__": sys.exit(main_of_script(__file__))``)."""
    directory, name = os.path.split(os.path.abspath(path))
    sys.path.insert(0, directory)  # the ranks find it there too: they inherit sys.path
    return importlib.import_module(name.removesuffix(".py")).main(*args)


def run_on_cluster(cluster, fn, *args: Any, timeout: float = 300.0) -> list[Any]:
    """``fn(rank, world_size, *args)`` on every host of ``cluster`` (its ``hosts``,
    ``namespaces`` — ``None`` for hosts that are local processes — and what
    :func:`~commpress.cluster.launcher.rank_environment` reads); results by rank. A rank
    that raises, dies or outlives ``timeout`` seconds raises :class:`DistributedError`
    naming the cluster."""
    check_not_importing_script("a job is being run on the cluster")
    environments = [
        {**os.environ, **rank_environment(cluster, host, 0, 1, DEFAULT_PORT)}
        for host in range(cluster.hosts)
    ]
    try:
        return run_ranks(fn, args, environments, namespaces=cluster.namespaces, timeout=timeout)
    except DistributedError as error:
        raise type(error)(f"the job on {cluster.describe()}: {error}") from None
