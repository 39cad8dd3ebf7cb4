"""What a schedule is made of: frozen dataclasses, printable, with no tensors in them.

A :class:`Schedule` is one rank's part of a collective: an ordered list of
:class:`Step`\\ s. A step posts its sends and receives together; each names the peers, the
chunk (and the piece of it, where a chunk is pipelined in pieces), what the sender does
to get the payload (:class:`Prepare`), what the receiver does with it (:class:`Then`) and
the bytes one copy of the payload puts on the wire.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

from commpress.units import counted


class Prepare(enum.Enum):
    """Where the payload of a send comes from."""

    ENCODE = "encode own"  # the sender's own data, encoded for this send
    FORWARD = "forward"  # a payload this rank received (and, for reductions, re-encoded)


class Then(enum.Enum):
    """What the receiver does with a payload once it has arrived."""

    DECODE = "decode"  # into the output; the payload itself is forwarded as is
    DECODE_REENCODE = "decode, re-encode"  # into the output, then encode that to forward
    ADD_REENCODE = "decode, add own, re-encode"  # a partial sum, forwarded after the add
    ADD_KEEP = "decode, add own, keep"  # the last hop: the chunk's sum over every rank
    SUM = "decode, sum in fp32"  # one contribution to the own chunk

    @property
    def rewrites_payload(self) -> bool:
        """Whether a later send of this chunk piece waits for this action, not only for the
        payload's arrival."""
        return self in (Then.DECODE_REENCODE, Then.ADD_REENCODE)


class Transport(enum.Enum):
    """What moves a schedule's payloads."""

    P2P = "p2p"  # one batch of point-to-point sends and receives per step
    #: one per step: every rank broadcasts a payload (on gloo, with CPU tensors and large
    #: payloads, the executor posts it point to point between two ranks:
    #: :func:`commpress.collectives.executor.point_to_point_on_gloo`)
    ALL_GATHER = "the backend's all-gather"
    #: one per step: a payload for every peer (on gloo, with CPU tensors and large
    #: payloads, posted point to point: the same)
    ALL_TO_ALL = "the backend's all-to-all"
    MULTICAST = "reliable multicast"  # one broadcast per step, replicated by the network

    @property
    def replicates(self) -> bool:
        """Whether the network copies a send to its destinations (the sender injects one)."""
        return self is Transport.MULTICAST


@dataclass(frozen=True)
class Send:
    dsts: tuple[int, ...]  # several destinations: a broadcast of one payload
    chunk: int
    piece: int
    offset: int  # first element of the piece within the chunk
    numel: int
    wire_bytes: int  # one copy, to one destination
    prepare: Prepare


@dataclass(frozen=True)
class Receive:
    src: int
    chunk: int
    piece: int
    offset: int
    numel: int
    wire_bytes: int
    then: Then


@dataclass(frozen=True)
class Step:
    round: int  # the algorithm's step (a ring's hop); the pieces of a round share it
    sends: tuple[Send, ...]
    receives: tuple[Receive, ...]

    @property
    def sent_bytes(self) -> int:
        """Bytes this rank injects: one copy per destination."""
        return sum(send.wire_bytes * len(send.dsts) for send in self.sends)


@dataclass(frozen=True)
class Schedule:
    op: str  # "all_gather" or "reduce_scatter"; all-reduce is one of each
    algorithm: str
    codec: str  # canonical codec spec
    rank: int
    world_size: int
    chunk_numel: int  # elements of one chunk: a rank's shard, or its share of a reduction
    payload_dtype: str  # what the codec encodes: input dtype, or "float32" partial sums
    transport: Transport
    steps: tuple[Step, ...]

    @classmethod
    def of(cls, op, algorithm, codec, rank, world_size, numel, dtype, transport, steps):
        """A schedule of ``steps`` for a chunk of ``numel`` elements encoded as ``dtype``."""
        return cls(
            op=op,
            algorithm=algorithm,
            codec=str(codec),
            rank=rank,
            world_size=world_size,
            chunk_numel=numel,
            payload_dtype=str(dtype).removeprefix("torch."),
            transport=transport,
            steps=tuple(steps),
        )

    @property
    def sent_bytes(self) -> int:
        """Bytes this rank injects: one copy per destination, or one per send where the
        network replicates it."""
        if self.transport.replicates:
            return sum(send.wire_bytes for step in self.steps for send in step.sends)
        return sum(step.sent_bytes for step in self.steps)

    @property
    def received_bytes(self) -> int:
        """Bytes that arrive at this rank."""
        return sum(r.wire_bytes for step in self.steps for r in step.receives)

    @property
    def rounds(self) -> int:
        return len({step.round for step in self.steps})

    @functools.cached_property
    def wire_sizes(self) -> tuple[int, ...]:
        """The bytes of every send, step by step: the shape of this rank's traffic."""
        return tuple(send.wire_bytes for step in self.steps for send in step.sends)

    @functools.cached_property  # schedules are cached, and this is asked on every call
    def chains_right(self) -> bool:
        """Whether this is a chain: every step one send to the right neighbour in the ring
        and one receive from the left, in at least ``n - 1`` steps, each step receiving a
        (chunk, piece) that no earlier step received and that the previous step does not
        send. A chain's messages can carry the argument check
        (:mod:`commpress.collectives.inband`), and with one step in flight at a time each
        receive can be posted a step ahead without landing in a buffer still in use (the
        payloads keep one buffer per (chunk, piece):
        :class:`~commpress.collectives.payloads.Slots`)."""
        n = self.world_size
        if self.transport is not Transport.P2P or len(self.steps) < n - 1:
            return False
        left, right = (self.rank - 1) % n, (self.rank + 1) % n
        one_each_way = all(
            len(step.sends) == 1
            and step.sends[0].dsts == (right,)
            and len(step.receives) == 1
            and step.receives[0].src == left
            for step in self.steps
        )
        if not one_each_way:
            return False
        received = [(s.receives[0].chunk, s.receives[0].piece) for s in self.steps]
        sent = [(s.sends[0].chunk, s.sends[0].piece) for s in self.steps]
        distinct = len(set(received)) == len(received)
        return distinct and all(r != s for r, s in zip(received[1:], sent, strict=False))

    def __str__(self) -> str:
        head = (
            f"{self.op} {self.algorithm}, codec {self.codec}, rank {self.rank} of "
            f"{self.world_size}: chunk of {counted(self.chunk_numel, 'element')} encoded as "
            f"{self.payload_dtype}, over {self.transport.value}; "
            f"{counted(len(self.steps), 'step')}, {counted(self.rounds, 'round')}, "
            f"{counted(self.sent_bytes, 'byte')} sent"
        )
        lines = [head]
        for index, step in enumerate(self.steps):
            for send in step.sends:
                lines.append(
                    f"  {index:>3} r{step.round:<3} send    chunk {send.chunk} piece {send.piece} "
                    f"[{send.offset}:{send.offset + send.numel}] -> {_peers(send.dsts)}: "
                    f"{send.prepare.value}, {send.wire_bytes} B"
                )
            for receive in step.receives:
                lines.append(
                    f"  {index:>3} r{step.round:<3} receive chunk {receive.chunk} piece "
                    f"{receive.piece} [{receive.offset}:{receive.offset + receive.numel}] <- "
                    f"{receive.src}: {receive.then.value}, {receive.wire_bytes} B"
                )
        return "\n".join(lines)


def _peers(ranks: tuple[int, ...]) -> str:
    return ",".join(map(str, ranks))
