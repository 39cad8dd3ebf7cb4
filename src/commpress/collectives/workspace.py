"""Scratch memory of the communication thread, kept from one collective to the next.

Fresh memory costs a page fault per page on first touch; on the project's VM,
writing 64 MiB of fresh memory takes about 30 times longer than int8-encoding
64 MiB already resident (117 ms against 4 ms). Buffers therefore live here,
one per name and device, grow to the largest request and are reused. Only the
communication thread (``work.launch``) uses them, one collective at a time.
"""

from __future__ import annotations

import torch

ALIGNMENT = 64
#: Values kept at most (:meth:`Workspace.keep`): a model's distinct collective shapes.
KEPT_MOST = 512


class Workspace:
    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.device], torch.Tensor] = {}
        # what callers keep between collectives that holds views of the buffers (each view
        # keeps its memory alive): dropped with them, before a buffer is replaced
        self._kept: dict[object, object] = {}

    def take(self, name: str, numel: int, dtype: torch.dtype, device) -> torch.Tensor:
        """A tensor of ``numel`` elements of ``dtype`` (contents undefined), valid until the
        next ``take`` of the same name."""
        nbytes = numel * dtype.itemsize
        key = (name, torch.device(device))
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < nbytes:
            del buffer  # let the old one go before the larger one is allocated
            self._buffers.pop(key, None)
            self._kept.clear()
            rounded = -(-max(nbytes, 1) // ALIGNMENT) * ALIGNMENT
            buffer = torch.empty(rounded, dtype=torch.uint8, device=device)
            self._buffers[key] = buffer
        taken = buffer[:nbytes]
        return taken if dtype == torch.uint8 else taken.view(dtype)  # a view costs microseconds

    def take_pieces(self, name: str, sizes: list[int], device) -> list[torch.Tensor]:
        """Consecutive byte buffers of the given sizes, carved from one ``take``."""
        whole = self.take(name, sum(sizes), torch.uint8, device)
        return list(torch.split(whole, sizes)) if sizes else []

    def held_bytes(self) -> int:
        return sum(buffer.numel() for buffer in self._buffers.values())

    def kept(self, key) -> object | None:
        """What :meth:`keep` kept under ``key``, unless a buffer was replaced or freed since."""
        return self._kept.get(key)

    def keep(self, key, value) -> None:
        """Keep ``value``, which holds views of the buffers, for later collectives; at most
        :data:`KEPT_MOST` values (more drops every one kept before)."""
        if len(self._kept) >= KEPT_MOST:
            self._kept.clear()
        self._kept[key] = value

    def release(self) -> None:
        self._kept.clear()
        self._buffers.clear()


#: The communication thread's workspace.
workspace = Workspace()
