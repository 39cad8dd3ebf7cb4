"""A cost model on the runtime's own schedules, to project commpress to hundreds of nodes.

:func:`~commpress.sim.model.simulate` times one call on a topology
(:mod:`commpress.sim.topology`: one switch, racks behind an uplink, a fat tree) and counts
the bytes on every link; :mod:`commpress.sim.calibrate` fits its per-message time and link
efficiency to ``commpress bench`` measurements. ``commpress sim`` is its command line.
:mod:`commpress.sim.tuner` (``algorithm="auto"``) and :mod:`commpress.sim.calibrate` are
imported on first use, so that ``cp.sim.tuner.configure(...)`` works after ``import
commpress as cp``.
"""

import importlib

from commpress.sim.model import Params, Row, simulate
from commpress.sim.topology import FatTree, Racks, Switch, Topology, parse_topology

__all__ = ["FatTree", "Params", "Racks", "Row", "Switch", "Topology", "parse_topology", "simulate"]


def __getattr__(name: str):
    if name in ("tuner", "calibrate"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
