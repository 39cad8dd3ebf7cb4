"""Cluster tests need root and iproute2 (CI has both); each leaves the host as it found it."""

from __future__ import annotations

import os
import shutil

import pytest

from commpress.cluster import Layout, present, remove

# Never the default "cp": a user's own cluster is left alone. Overridable so that two test
# runs on one machine (each needs its own namespaces and bridge) do not remove each other's.
PREFIX = os.environ.get("COMMPRESS_TEST_CLUSTER_PREFIX", "cpt")

if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
    pytest.skip("the emulated cluster needs root and iproute2", allow_module_level=True)


@pytest.fixture
def prefix():
    """The test cluster's name; whatever a failing test left of it is removed afterwards."""
    layout = Layout(PREFIX)
    if present(layout):
        remove(layout)
    yield PREFIX
    leftovers = present(layout)
    remove(layout)
    assert not leftovers, f"the test left {leftovers} behind"
