"""``run_distributed``: ranks forked from a preloaded server, each with the caller's environment."""

from __future__ import annotations

import os
import sys

import pytest

from commpress.cluster.local import PRELOADED_MODULES, DistributedError, run_distributed

VARIABLE = "COMMPRESS_TEST_RUNNER_VARIABLE"


def _seen(rank, world_size):
    return os.environ.get(VARIABLE), sorted(set(PRELOADED_MODULES) - set(sys.modules))


def test_each_rank_sees_the_environment_of_the_call_not_of_the_servers_start(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    assert run_distributed(_seen, 2) == [(None, [])] * 2  # the server runs from here on
    monkeypatch.setenv(VARIABLE, "set after the server started")
    assert run_distributed(_seen, 2) == [("set after the server started", [])] * 2
    monkeypatch.delenv(VARIABLE)
    assert run_distributed(_seen, 2) == [(None, [])] * 2


def _fail_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("rank one refuses")
    return rank


def test_a_rank_that_raises_fails_the_run_with_its_traceback():
    with pytest.raises(DistributedError, match="(?s)rank 1 failed.*rank one refuses"):
        run_distributed(_fail_on_rank_one, 2, timeout=60)


@pytest.mark.parametrize("world_size", [0, -1, True, 2.0])
def test_a_bad_world_size_is_a_value_error(world_size):
    with pytest.raises(ValueError, match="world_size"):
        run_distributed(_seen, world_size)
