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

import contextlib

import torch

from commpress.codecs import Codec
from commpress.codecs.blockwise import streaming_decodes
from commpress.collectives.workspace import workspace
from commpress.schedules import Receive, Schedule, Send, Step, Then, Transport
from commpress.schedules.wire import HEADER_BYTES

#: A reduce-scatter's fp32 sums and decode scratch, in the communication thread's workspace
#: (whatever the schedule: one collective at a time).
RESULT, SCRATCH = "reduce_scatter.result", "reduce_scatter.scratch"


def slots(name: str, schedule: Schedule, device: torch.device) -> Slots:
    """The :class:`Slots` of a run of ``schedule``: those of its last run, where the
    workspace still holds their memory (a training step repeats the same calls), with their
    views (each costs microseconds to make) and their messages back in their rows."""
    key = ("slots", name, torch.device(device), id(schedule))  # a Slots holds its schedule
    kept = workspace.kept(key)
    if isinstance(kept, Slots) and kept.schedule is schedule:
        kept.restore()
        return kept
    made = Slots(name, schedule, device)
    workspace.keep(key, made)
    return made


class Slots:
    """One payload buffer per (chunk, piece), each chunk's pieces back to back in a row:
    ``rows`` is (world_size, bytes of one chunk's payloads). A point-to-point schedule's
    payloads each follow room for the header of the message that carries them
    (:mod:`commpress.collectives.inband`)."""

    def __init__(self, name: str, schedule: Schedule, device):
        self.schedule = schedule
        transfers = [t for step in schedule.steps for t in (*step.sends, *step.receives)]
        cuts = sorted({(t.piece, t.offset, t.numel, t.wire_bytes) for t in transfers})
        self.pieces = [(offset, numel) for _, offset, numel, _ in cuts]
        self.header = HEADER_BYTES if schedule.transport is Transport.P2P else 0
        self._bytes: dict[int, tuple[int, int]] = {}  # piece -> (first byte in the row, bytes)
        row = 0
        for piece, _, _, wire in cuts:
            self._bytes[piece] = (row + self.header, wire)
            row += self.header + wire
        n = schedule.world_size
        self.rows = workspace.take(name, n * row, torch.uint8, device).view(n, row)
        # (chunk, piece) -> its message and its payload, made once per run: a run asks for
        # each several times, and a view costs microseconds to make
        self._messages: dict[tuple[int, int], torch.Tensor] = {}
        self._payloads: dict[tuple[int, int], torch.Tensor] = {}
        self._moved: set[tuple[int, int]] = set()

    def __call__(self, chunk: int, piece: int) -> torch.Tensor:
        payload = self._payloads.get((chunk, piece))
        if payload is None:
            payload = self.message(chunk, piece)
            if self.header:
                payload = payload[self.header :]
            self._payloads[chunk, piece] = payload
        return payload

    def message(self, chunk: int, piece: int) -> torch.Tensor:
        """The payload with the room for its header in front."""
        message = self._messages.get((chunk, piece))
        if message is None:
            start, size = self._bytes[piece]
            message = self.rows[chunk, start - self.header : start + size]
            self._messages[chunk, piece] = message
        return message

    def move(self, chunk: int, piece: int, message: torch.Tensor) -> None:
        """From now on the message of ``(chunk, piece)`` lives in ``message`` (header room
        first), not in its row."""
        if message.numel() != self.message(chunk, piece).numel():
            raise ValueError("a moved message must keep its size")
        self._messages[chunk, piece] = message
        self._payloads.pop((chunk, piece), None)
        self._moved.add((chunk, piece))

    def restore(self) -> None:
        """Every message back in its row, for the next run."""
        for key in self._moved:
            self._messages.pop(key, None)
            self._payloads.pop(key, None)
        self._moved.clear()


class _InSlots:
    """Payloads kept in :class:`Slots`: each transfer's buffer is its (chunk, piece)."""

    slots: Slots

    def send_buffer(self, send: Send) -> torch.Tensor:
        return self.slots(send.chunk, send.piece)

    def receive_buffer(self, receive: Receive) -> torch.Tensor:
        return self.slots(receive.chunk, receive.piece)

    def send_message(self, send: Send) -> torch.Tensor:
        return self.slots.message(send.chunk, send.piece)

    def receive_message(self, receive: Receive) -> torch.Tensor:
        return self.slots.message(receive.chunk, receive.piece)

    def move_message(self, receive: Receive, message: torch.Tensor) -> None:
        self.slots.move(receive.chunk, receive.piece, message)


class Gathered(_InSlots):
    encodes_change_state = False

    def __init__(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        codec: Codec,
        schedule: Schedule,
        stream_output: bool = False,
    ):
        """``stream_output``: ``out`` is written and left to the caller (the decodes into it
        may then write past the caches: :data:`~commpress.codecs.blockwise.streaming_decodes`),
        not read back at once (an all-reduce's gather into a buffer it copies out)."""
        self.rank, self.codec = schedule.rank, codec
        self._writing = streaming_decodes if stream_output else contextlib.nullcontext()
        self.inp, self.dtype, self.device = inp, inp.dtype, inp.device
        self.chunks = out.view(schedule.world_size, inp.numel())
        self.slots = slots("all_gather.payloads", schedule, inp.device)
        self._held: list[tuple[int, int, int, int]] | None = None
        self.held_bytes = out.numel() * out.element_size()

    def encode_own(self, send: Send) -> None:
        part = _piece(self.inp, send.offset, send.numel)
        self.codec.encode(part, out=self.slots(send.chunk, send.piece))

    def begin(self) -> None:
        if not self.slots.pieces:  # a world of one sends nothing, but decodes as any rank
            encoded = self.codec.encode(self.inp)
            with self._writing:
                self.codec.decode(encoded, self.inp.numel(), self.dtype, out=self.chunks[self.rank])
        for piece, (offset, numel) in enumerate(self.slots.pieces):
            self._decode(self.rank, piece, offset, numel)

    def handle(self, receive: Receive) -> None:
        chunk, piece = receive.chunk, receive.piece
        if receive.then is Then.DECODE_REENCODE and self._held is not None:
            # the re-encode needs the decoded values before ``out`` may be written; the
            # codec is idempotent (ring-hop refuses others), so decoding the re-encoded
            # payload at the end gives the same bits
            scratch = workspace.take("all_gather.hop", receive.numel, self.dtype, self.device)
            self.codec.decode(self.slots(chunk, piece), receive.numel, self.dtype, out=scratch)
            self.codec.encode(scratch, out=self.slots(chunk, piece))
            self._held.append((chunk, piece, receive.offset, receive.numel))
            return
        self._decode(chunk, piece, receive.offset, receive.numel)
        if receive.then is Then.DECODE_REENCODE:
            decoded = self.chunks[chunk, receive.offset : receive.offset + receive.numel]
            self.codec.encode(decoded, out=self.slots(chunk, piece))

    def hold(self) -> None:
        """From now on, nothing is written to ``out`` until :meth:`release`."""
        self._held = []

    def release(self) -> None:
        held, self._held = self._held or [], None
        for chunk, piece, offset, numel in held:
            self._decode(chunk, piece, offset, numel)

    def gathered(self) -> torch.Tensor:
        return self.slots.rows.view(-1)

    def _decode(self, chunk: int, piece: int, offset: int, numel: int) -> None:
        if self._held is not None:
            self._held.append((chunk, piece, offset, numel))
            return
        out = _piece(self.chunks[chunk], offset, numel)
        with self._writing:
            self.codec.decode(self.slots(chunk, piece), numel, self.dtype, out=out)


class PartialSums(_InSlots):
    """``result`` holds this rank's chunk, summed over every rank in fp32, after the run.

    With a lossless codec on 16-bit input the partial sums travel in the input's dtype
    (:func:`~commpress.schedules.partial_sum_dtype`): decoded through ``narrow``, added
    in fp32, rounded back into ``narrow`` before encoding.
    """

    encodes_change_state = False
    held_bytes = 0  # the result is copied out after the run

    def __init__(self, contributions: torch.Tensor, codec: Codec, schedule: Schedule):
        self.codec, self.rank = codec, schedule.rank
        self.contributions = contributions  # (world_size, chunk numel)
        self.sent_dtype = getattr(torch, schedule.payload_dtype)
        numel, device = contributions.shape[1], contributions.device
        self.device = device
        self.slots = slots("reduce_scatter.payloads", schedule, device)
        largest = max((size for _, size in self.slots.pieces), default=0)
        self.result = _fp32(RESULT, numel, device)
        self.scratch = _fp32(SCRATCH, largest, device)
        self.narrow = None
        if self.sent_dtype != torch.float32:
            self.narrow = workspace.take("reduce_scatter.narrow", largest, self.sent_dtype, device)
        self.world_size = schedule.world_size

    def encode_own(self, send: Send) -> None:
        own = _piece(self.contributions[send.chunk], send.offset, send.numel)
        self.codec.encode(own.to(self.sent_dtype), out=self.slots(send.chunk, send.piece))

    def begin(self) -> None:
        if self.world_size == 1:
            self.result.copy_(self.contributions[self.rank])

    def hold(self) -> None:
        """Nothing to hold: the caller copies ``result`` out after the run."""

    def release(self) -> None:
        pass

    def handle(self, receive: Receive) -> None:
        numel = receive.numel
        payload = self.slots(receive.chunk, receive.piece)
        keep = receive.then is Then.ADD_KEEP
        if keep:  # the last hop sums straight into the result
            partial = _piece(self.result, receive.offset, numel)
        else:
            partial = _piece(self.scratch, 0, numel)
        if self.narrow is None:
            self.codec.decode(payload, numel, torch.float32, out=partial)
        else:
            rounded = self.narrow[:numel]
            partial.copy_(self.codec.decode(payload, numel, self.sent_dtype, out=rounded))
        partial += _piece(self.contributions[receive.chunk], receive.offset, numel)
        if keep:
            return
        if self.narrow is None:
            self.codec.encode(partial, out=payload)
        else:
            self.codec.encode(self.narrow[:numel].copy_(partial), out=payload)


class Contributions:
    """``result`` holds this rank's chunk summed in fp32 after the run. ``residual``: error
    feedback (fp32, shaped like ``contributions``): added before each encode, then set to
    what the encode lost (zero where that is not finite).

    The payloads of each piece of the slices sit in a block of their own, one row per
    rank (the own row unused), which one all-to-all of that piece moves whole."""

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
        # a codec object without ``draws_noise`` (not a CodecBase) is taken to draw noise
        self.encodes_in_any_order = residual is None and not getattr(codec, "draws_noise", True)
        self.held_bytes = 0
        self.numel, self.dtype = contributions.shape[1], contributions.dtype
        device, n = contributions.device, schedule.world_size
        self.device = device
        cuts = {(t.piece, t.wire_bytes) for step in schedule.steps for t in step.sends}
        wires = [wire for _, wire in sorted(cuts)]
        sent = workspace.take("alltoall.send", n * sum(wires), torch.uint8, device)
        received = workspace.take("alltoall.received", n * sum(wires), torch.uint8, device)
        self.sent, self.received = _blocks(sent, n, wires), _blocks(received, n, wires)
        for block in self.sent:
            block[self.rank] = 0  # the own row is never encoded, but it is sent: keep it clean
        self.result = None

    def encode_own(self, send: Send) -> None:
        payload = self.send_buffer(send)
        own = _piece(self.contributions[send.chunk], send.offset, send.numel)
        if self.residual is None or self.codec.lossless:  # lossless: nothing to feed back
            self.codec.encode(own, out=payload)
            return
        corrected = own.float() + _piece(self.residual[send.chunk], send.offset, send.numel)
        self.codec.encode(corrected, out=payload)
        lost = decode_fp32(self.codec, payload, send.numel, torch.float32)
        residual = _piece(self.residual[send.chunk], send.offset, send.numel)
        torch.sub(corrected, lost, out=residual)
        # a non-finite value has reached this call's output; fed back, it would reach every
        # later call's too (an fp16 overflow step that the grad scaler skips would stall
        # training): its residual starts again from zero
        residual.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)

    def begin(self) -> None:
        self.result = _fp32(RESULT, self.numel, self.device)
        self.result.copy_(self.contributions[self.rank])

    def send_buffer(self, send: Send) -> torch.Tensor:
        return self.sent[send.piece][send.chunk]

    def receive_buffer(self, receive: Receive) -> torch.Tensor:
        return self.received[receive.piece][receive.src]

    def handle(self, receive: Receive) -> None:
        payload = self.receive_buffer(receive)
        summed = _piece(self.result, receive.offset, receive.numel)
        scratch = _fp32(SCRATCH, receive.numel, self.device)
        summed += decode_fp32(self.codec, payload, receive.numel, self.dtype, out=scratch)

    def exchanged(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        piece = step.sends[0].piece
        return self.sent[piece].view(-1), self.received[piece].view(-1)


def _blocks(buffer: torch.Tensor, n: int, wires: list[int]) -> list[torch.Tensor]:
    """``buffer`` cut into one (n, wire) block per piece, back to back."""
    blocks, start = [], 0
    for wire in wires:
        blocks.append(buffer[start : start + n * wire].view(n, wire))
        start += n * wire
    return blocks


def _fp32(name: str, numel: int, device: torch.device) -> torch.Tensor:
    return workspace.take(name, numel, torch.float32, device)


def _piece(row: torch.Tensor, offset: int, numel: int) -> torch.Tensor:
    """``row[offset : offset + numel]``: ``row`` itself where that is all of it (a slice
    costs microseconds, several times a run)."""
    return row if offset == 0 and numel == row.shape[0] else row[offset : offset + numel]


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


def decode_fp32(
    codec: Codec, payload, numel: int, encoded_dtype: torch.dtype, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Lossy payloads decode straight to fp32 (no detour through a 16-bit dtype), into
    ``out`` where given (memory kept from call to call: fresh memory faults a page at a
    time); a lossless payload holds ``encoded_dtype`` bytes, which widen to fp32 exactly
    (into ``out`` too where they are fp32 already)."""
    if codec.lossless:
        into = out if encoded_dtype == torch.float32 else None  # else widened below
        return codec.decode(payload, numel, encoded_dtype, out=into).float()
    return codec.decode(payload, numel, torch.float32, out=out)
