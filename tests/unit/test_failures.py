"""A backend's timeout inside a compressed collective, named (one process, no group)."""

from __future__ import annotations

import sys
from datetime import timedelta

import pytest
import torch

from commpress.collectives import failures
from commpress.collectives.failures import CollectiveTimeoutError, named_failures
from commpress.collectives.fingerprint import CollectiveMismatchError
from commpress.transport import owned_groups


class _BackendError(RuntimeError):
    """A backend's own subclass (torch's DistBackendError, on NCCL)."""


@pytest.fixture
def described(monkeypatch):
    monkeypatch.setattr(failures, "describe", lambda *args: "all_reduce (int8@ring) on ...")


@pytest.mark.parametrize(
    "said",
    [
        "Operation timed out!",
        # gloo, to the other transfers of a connection closed by a timeout
        "Application timeout caused pair closure",
    ],
)
def test_a_plain_timeout_becomes_a_named_runtime_error(described, said):
    waiting = named_failures("all_reduce", "int8", "ring", None, timedelta(seconds=3))
    with pytest.raises(CollectiveTimeoutError) as caught, waiting:
        raise RuntimeError(said)
    assert isinstance(caught.value, RuntimeError)
    if said.startswith("Application timeout"):  # maybe an earlier call's: not "timed out"
        assert str(caught.value).startswith(
            "commpress all_reduce (int8@ring) on ... failed after 0.0 s: a connection of its "
            "group was closed by a timeout, this call's (timeout=0:00:03) or an earlier"
        ), str(caught.value)
    else:
        assert str(caught.value).startswith("commpress all_reduce (int8@ring) on ... timed out")
        assert "(timeout=0:00:03)" in str(caught.value)
    assert str(caught.value.__cause__) == said


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes came in Python 3.11")
def test_a_timeout_of_a_backends_own_type_keeps_it(described):
    waiting = named_failures("all_reduce", "int8", "ring", None, None)
    with pytest.raises(_BackendError) as caught, waiting:
        raise _BackendError("Work ran for 3000 milliseconds before timing out")
    (note,) = caught.value.__notes__
    assert note.startswith("commpress all_reduce (int8@ring) on ... timed out after")
    assert "(the process group's timeout)" in note


def test_another_backend_error_names_the_collective_and_keeps_its_type(described):
    """A peer that died: gloo's "Connection closed by peer" named no collective."""
    failing = named_failures("all_reduce", "int8", "ring", None, None)
    with pytest.raises(RuntimeError) as caught, failing:
        raise RuntimeError("Connection closed by peer [127.0.0.1]:31435")
    assert type(caught.value) is RuntimeError
    assert str(caught.value).startswith("commpress all_reduce (int8@ring) on ... failed after ")
    assert str(caught.value).endswith(": Connection closed by peer [127.0.0.1]:31435")


class _OwnError(RuntimeError):
    """commpress's own (a CollectiveMismatchError, say): it says what it is."""


@pytest.mark.parametrize("error", [_OwnError("ranks differ"), ValueError("x")])
def test_what_is_not_a_backend_error_passes_as_it_is(described, error):
    waiting = named_failures("all_reduce", "int8", "ring", None, None)
    with pytest.raises(type(error)) as caught, waiting:
        raise error
    assert caught.value is error


class _Group:
    """Stands for a process group (weakly referenced, as owned_groups keeps them)."""


@pytest.mark.parametrize(
    "error, failed",
    [
        (RuntimeError("Connection closed by peer"), True),
        (RuntimeError("Timed out waiting 3000ms for recv operation to complete"), True),
        # NCCL's own type, a RuntimeError of its own: a peer that died
        (torch.distributed.DistBackendError("NCCL error: remote process exited"), True),
        # the group stays in step after a mismatch, and after bad input
        (CollectiveMismatchError("ranks of a group of 2 called ..."), False),
        (ValueError("out must be ..."), False),
    ],
    ids=["closed", "timed-out", "nccl", "mismatch", "bad-input"],
)
def test_a_backends_error_marks_the_group_failed_and_only_that(monkeypatch, error, failed):
    """A group marked failed is never handed to another wrapper (owned_groups); NCCL's
    DistBackendError was not marked, being neither a plain RuntimeError nor a timeout."""
    monkeypatch.setattr(failures, "registered", lambda group: True)
    group = _Group()
    with pytest.raises(type(error)), failures.named_as("a call", None, group):
        raise error
    assert (group in owned_groups._failed) is failed


class _Formatting(RuntimeError):
    def __init__(self, part):
        super().__init__(f"part {part} failed")


class _KeywordOnly(RuntimeError):
    def __init__(self, *, reason):
        super().__init__(reason)
        self.reason = reason


def _raise_in_a_named_frame(error: BaseException) -> None:
    raise error


def _caught(error: BaseException) -> BaseException:
    try:
        try:
            raise ValueError("the first failure")
        except ValueError:
            _raise_in_a_named_frame(error)
    except BaseException as caught:  # noqa: BLE001 - the test's own
        return caught
    raise AssertionError("not raised")


@pytest.mark.parametrize("error", [_Formatting(3), _KeywordOnly(reason="gone")], ids=repr)
def test_a_frameless_copy_keeps_type_message_chain_and_where_it_was_raised(error):
    """The copy of a failed low-rank step's error kept for later calls and handed to DDP
    holds no frame; copy.copy re-ran __init__ on its formatted message ('part part 3 failed
    failed'), lost keyword-only types (a RuntimeError), and dropped the context and the
    traceback, the only record of where the step failed."""
    from commpress.lowrank.reducer import frameless

    original = _caught(error)
    copied = frameless(original)
    assert type(copied) is type(original) and str(copied) == str(original)
    assert copied.__traceback__ is None and copied.__context__.__traceback__ is None
    assert str(copied.__context__) == "the first failure"
    assert any("_raise_in_a_named_frame" in note for note in copied.__notes__)
    assert getattr(copied, "reason", None) == getattr(original, "reason", None)
