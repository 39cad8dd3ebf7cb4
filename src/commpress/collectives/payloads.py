"""What the actions of a schedule do to tensors: the payload buffers of one run and the
codec work behind ``encode own``, ``decode``, ``decode, add own, re-encode`` and the rest.

* :class:`Gathered`: an all-gather. Payloads sit one per chunk; the owner keeps the
  *decoded* copy of its own shard, so every rank ends with the same bits.
* :class:`PartialSums`: a reduce-scatter whose hops add (ring, ring-hop). Each received
  partial sum is decoded to fp32, the own contribution added, and re-encoded in place for
  the next hop; the last hop keeps the fp32 sum.
* :class:`Contributions`: a reduce-scatter whose destination sums (alltoall). Each slice
  is encoded once at its owner; the destination adds every decoded slice in fp32, and its
  own slice exactly.
"""

from __future__ import annotations

import torch

from commpress.codecs import Codec
from commpress.collectives.workspace import workspace
from commpress.schedules import Receive, Schedule, Send, Then


class Gathered:
    encodes_change_state = False

    def __init__(self, out: torch.Tensor, inp: torch.Tensor, codec: Codec, schedule: Schedule):
        self.rank, self.codec = schedule.rank, codec
        self.inp, self.numel, self.dtype = inp, inp.numel(), inp.dtype
        self.chunks = out.view(schedule.world_size, self.numel)
        wire = codec.wire_bytes(self.numel, self.dtype)
        slots = workspace.take(
            "all_gather.payloads", schedule.world_size * wire, torch.uint8, inp.device
        )
        self.slots = slots.view(schedule.world_size, wire)

    def encode_own(self, send: Send) -> None:
        self.codec.encode(self.inp, out=self.slots[send.chunk])

    def begin(self) -> None:
        self._decode(self.rank)

    def send_buffer(self, send: Send) -> torch.Tensor:
        return self.slots[send.chunk]

    def receive_buffer(self, receive: Receive) -> torch.Tensor:
        return self.slots[receive.chunk]

    def handle(self, receive: Receive) -> None:
        self._decode(receive.chunk)
        if receive.then is Then.DECODE_REENCODE:
            self.codec.encode(self.chunks[receive.chunk], out=self.slots[receive.chunk])

    def gathered(self) -> torch.Tensor:
        return self.slots.view(-1)

    def _decode(self, chunk: int) -> None:
        self.codec.decode(self.slots[chunk], self.numel, self.dtype, out=self.chunks[chunk])


class PartialSums:
    """``result`` holds this rank's chunk, summed over every rank in fp32, after the run.

    With a lossless codec on 16-bit input the partial sums travel in the input's dtype
    (:func:`~commpress.schedules.partial_sum_dtype`): decoded through ``narrow``, added
    in fp32, rounded back into ``narrow`` before encoding.
    """

    encodes_change_state = False

    def __init__(self, contributions: torch.Tensor, codec: Codec, schedule: Schedule):
        self.codec, self.rank = codec, schedule.rank
        self.contributions = contributions  # (world_size, chunk numel)
        self.sent_dtype = getattr(torch, schedule.payload_dtype)
        numel, device = contributions.shape[1], contributions.device
        cuts = {(s.piece, s.offset, s.numel) for step in schedule.steps for s in step.sends}
        cuts = sorted(cuts)
        self._slot_of = {}  # piece -> (offset in a chunk's bytes, bytes)
        chunk_wire = 0
        for piece, _, size in cuts:
            wire = codec.wire_bytes(size, self.sent_dtype)
            self._slot_of[piece] = (chunk_wire, wire)
            chunk_wire += wire
        slots = workspace.take(
            "reduce_scatter.payloads", schedule.world_size * chunk_wire, torch.uint8, device
        )
        self.slots = slots.view(schedule.world_size, chunk_wire)
        largest = max((size for _, _, size in cuts), default=0)
        self.result = workspace.take("reduce_scatter.result", numel, torch.float32, device)
        self.scratch = workspace.take("reduce_scatter.scratch", largest, torch.float32, device)
        self.narrow = None
        if self.sent_dtype != torch.float32:
            self.narrow = workspace.take("reduce_scatter.narrow", largest, self.sent_dtype, device)
        self.world_size = schedule.world_size

    def _slot(self, chunk: int, piece: int) -> torch.Tensor:
        start, size = self._slot_of[piece]
        return self.slots[chunk, start : start + size]

    def encode_own(self, send: Send) -> None:
        own = self.contributions[send.chunk, send.offset : send.offset + send.numel]
        self.codec.encode(own.to(self.sent_dtype), out=self._slot(send.chunk, send.piece))

    def begin(self) -> None:
        if self.world_size == 1:
            self.result.copy_(self.contributions[self.rank])

    def send_buffer(self, send: Send) -> torch.Tensor:
        return self._slot(send.chunk, send.piece)

    def receive_buffer(self, receive: Receive) -> torch.Tensor:
        return self._slot(receive.chunk, receive.piece)

    def handle(self, receive: Receive) -> None:
        parts = slice(receive.offset, receive.offset + receive.numel)
        payload = self._slot(receive.chunk, receive.piece)
        partial = self.scratch[: receive.numel]
        if self.narrow is None:
            self.codec.decode(payload, receive.numel, torch.float32, out=partial)
        else:
            rounded = self.narrow[: receive.numel]
            partial.copy_(self.codec.decode(payload, receive.numel, self.sent_dtype, out=rounded))
        partial += self.contributions[receive.chunk, parts]
        if receive.then is Then.ADD_KEEP:
            self.result[parts].copy_(partial)
        elif self.narrow is None:
            self.codec.encode(partial, out=payload)
        else:
            self.codec.encode(self.narrow[: receive.numel].copy_(partial), out=payload)


class Contributions:
    """``result`` holds this rank's chunk summed in fp32 after the run. ``residual``: error
    feedback (fp32, shaped like ``contributions``): added before each encode, then set to
    what the encode lost."""

    def __init__(
        self,
        contributions: torch.Tensor,
        codec: Codec,
        schedule: Schedule,
        residual: torch.Tensor | None = None,
    ):
        self.codec, self.rank = codec, schedule.rank
        self.contributions, self.residual = contributions, residual
        self.encodes_change_state = residual is not None
        self.numel, self.dtype = contributions.shape[1], contributions.dtype
        wire = codec.wire_bytes(self.numel, self.dtype)
        device, n = contributions.device, schedule.world_size
        self.sent = workspace.take("alltoall.send", n * wire, torch.uint8, device).view(n, wire)
        self.sent[self.rank] = 0  # the own slot is never encoded, but it is sent: keep it clean
        self.received = workspace.take("alltoall.received", n * wire, torch.uint8, device)
        self.received = self.received.view(n, wire)
        self.result = None

    def encode_own(self, send: Send) -> None:
        destination = send.chunk
        if self.residual is None or self.codec.lossless:  # lossless: nothing to feed back
            self.codec.encode(self.contributions[destination], out=self.sent[destination])
            return
        corrected = self.contributions[destination].float() + self.residual[destination]
        self.codec.encode(corrected, out=self.sent[destination])
        lost = decode_fp32(self.codec, self.sent[destination], self.numel, torch.float32)
        torch.sub(corrected, lost, out=self.residual[destination])

    def begin(self) -> None:
        self.result = self.contributions[self.rank].to(torch.float32, copy=True)

    def send_buffer(self, send: Send) -> torch.Tensor:
        return self.sent[send.chunk]

    def receive_buffer(self, receive: Receive) -> torch.Tensor:
        return self.received[receive.src]

    def handle(self, receive: Receive) -> None:
        self.result += decode_fp32(self.codec, self.received[receive.src], self.numel, self.dtype)

    def exchanged(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sent.view(-1), self.received.view(-1)


def reduction(
    contributions: torch.Tensor, codec: Codec, schedule: Schedule, residual=None
) -> PartialSums | Contributions:
    """The payloads of a reduce-scatter schedule: summed at the destination, or hop by hop."""
    summed_at_destination = any(
        receive.then is Then.SUM for step in schedule.steps for receive in step.receives
    )
    if summed_at_destination:
        return Contributions(contributions, codec, schedule, residual)
    return PartialSums(contributions, codec, schedule)


def decode_fp32(codec: Codec, payload, numel: int, encoded_dtype: torch.dtype) -> torch.Tensor:
    """Lossy payloads decode straight to fp32 (no detour through a 16-bit dtype); a
    lossless payload holds ``encoded_dtype`` bytes, which widen to fp32 exactly."""
    if codec.lossless:
        return codec.decode(payload, numel, encoded_dtype).float()
    return codec.decode(payload, numel, torch.float32)
