"""Handles of compressed collectives, which run on one communication thread per process.

Every compressed collective, synchronous or not, is queued on the same single
thread, so commpress operations run in the order the program issued them on
every rank. A program must not run torch.distributed's own collectives on the
same group while a commpress ``async_op`` is in flight: their relative order
could differ between ranks.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from datetime import timedelta

import torch

_executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="commpress")


class CollectiveWork:
    """Like torch's ``Work``: ``wait()`` blocks (and re-raises), ``is_completed()`` polls."""

    def __init__(self, future: concurrent.futures.Future):
        self._future = future

    def wait(self, timeout: timedelta | None = None) -> bool:
        seconds = None if timeout is None else timeout.total_seconds()
        try:
            self._future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"collective did not complete within {timeout}") from None
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def torch_future(
        self, value=None, before: Callable[[], None] | None = None
    ) -> torch.futures.Future:
        """A ``torch.futures.Future`` completed with ``value`` (or this work's error) when the
        collective finishes; completing it never blocks a thread. ``before`` runs first, so
        whoever waits on the future sees its effects."""
        future = torch.futures.Future()

        def complete(done: concurrent.futures.Future) -> None:
            if before is not None:
                before()
            error = done.exception()
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        self._future.add_done_callback(complete)
        return future


def launch(run: Callable[[], None], async_op: bool) -> CollectiveWork | None:
    """Queue ``run`` on the communication thread; wait for it unless ``async_op``."""
    work = CollectiveWork(_executor.submit(run))
    if async_op:
        return work
    work.wait()
    return None
