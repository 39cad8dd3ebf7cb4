"""A cost model on the runtime's own schedules, to project commpress to hundreds of nodes.

:func:`~commpress.sim.model.simulate` times one call on a topology
(:mod:`commpress.sim.topology`: one switch, racks behind an uplink, a fat tree) and counts
the bytes on every link; :mod:`commpress.sim.calibrate` fits its per-message time and link
efficiency to ``commpress bench`` measurements. ``commpress sim`` is its command line.
"""

from commpress.sim.model import Params, Row, simulate
from commpress.sim.topology import FatTree, Racks, Switch, Topology, parse_topology

__all__ = ["FatTree", "Params", "Racks", "Row", "Switch", "Topology", "parse_topology", "simulate"]
