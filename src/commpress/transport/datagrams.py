"""The datagrams of the reliable multicast: one header, four kinds, a checksum over both.

Every datagram starts with a 26-byte header (little-endian)::

    magic 0xC7 | version << 4 | kind | sender u16 | root u16 | channel u16 | operation u32
    | chunk u32 | count u32 | payload length u16 | CRC-32 of the header before it and payload

26 bytes keep a full-size datagram at MTU 1500 within 5% of its payload on the wire
(1446 + 26 + UDP, IP and Ethernet headers). ``channel`` is a random number every rank of
one communicator shares, so datagrams of another communicator (or another program on the
same group and port) are told apart;
``operation`` numbers the communicator's broadcasts; ``root`` is the rank whose payload
the datagram is about, ``sender`` the rank that sent it (a repair comes from the root, an
ACK or NACK from a receiver). :func:`parse` refuses anything truncated, corrupted or of
another version: the caller counts it and treats it as lost.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass

MAGIC, VERSION = 0xC7, 1
HEADER = struct.Struct("<BBHHHIIIHI")
HEADER_BYTES = HEADER.size
_CRC = struct.Struct("<I")
_CRC_AT = HEADER_BYTES - _CRC.size
#: IPv4 (20), UDP (8) and Ethernet (14) headers: what a datagram adds on the wire, where
#: rate limits count bytes.
FRAME_OVERHEAD = 20 + 8 + 14
_IP_UDP = 28
MAX_UDP_PAYLOAD = 65507
_RANGE = struct.Struct("<II")
RANGE_BYTES = _RANGE.size  # one range of a NACK's payload


class Kind(enum.IntEnum):
    DATA = 1  # chunk ``chunk`` of ``count`` of the root's payload (multicast, or a repair)
    END = 2  # the root has sent all ``count`` chunks (multicast, repeated until every ACK)
    NACK = 3  # the sender lacks the root's chunks in the payload's ranges (to the root)
    ACK = 4  # the sender has all of the root's payload (to the root)


class Refused(ValueError):
    """Bytes that are not a datagram of this protocol version; ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Header:
    kind: Kind
    sender: int
    root: int
    channel: int
    operation: int
    chunk: int = 0
    count: int = 0


def chunk_bytes_for(mtu: int) -> int:
    """Payload bytes of one DATA datagram that fits an IPv4 packet of ``mtu`` bytes."""
    size = min(mtu - _IP_UDP, MAX_UDP_PAYLOAD) - HEADER_BYTES
    if size <= 0:
        raise ValueError(f"mtu {mtu} leaves no room for a payload after the headers")
    return size


def pack(header: Header, payload=b"") -> bytes:
    """One datagram: ``header`` then ``payload`` (bytes-like), checksummed."""
    return pack_header(header, payload) + bytes(payload)


def pack_header(header: Header, payload=b"") -> bytes:
    """The header of the datagram that carries ``payload``: send the two back to back
    (``socket.sendmsg([head, payload])``) and the payload is not copied."""
    head = HEADER.pack(
        MAGIC,
        VERSION << 4 | header.kind,
        header.sender,
        header.root,
        header.channel,
        header.operation,
        header.chunk,
        header.count,
        len(payload),
        0,
    )
    crc = zlib.crc32(payload, zlib.crc32(head[:_CRC_AT]))
    return head[:_CRC_AT] + _CRC.pack(crc)


def parse(datagram) -> tuple[Header, memoryview]:
    """The header and payload of ``datagram`` (bytes-like); :class:`Refused` otherwise."""
    view = memoryview(datagram)
    if len(view) < HEADER_BYTES:
        raise Refused("truncated")
    magic, version_kind, sender, root, channel, operation, chunk, count, length, crc = (
        HEADER.unpack_from(view)
    )
    version, kind = version_kind >> 4, version_kind & 0xF
    if magic != MAGIC:
        raise Refused("foreign")
    if version != VERSION:
        raise Refused("version")
    if len(view) != HEADER_BYTES + length:
        raise Refused("truncated")
    payload = view[HEADER_BYTES:]
    if zlib.crc32(payload, zlib.crc32(view[:_CRC_AT])) != crc:
        raise Refused("checksum")
    try:
        kind = Kind(kind)
    except ValueError:
        raise Refused("kind") from None
    return Header(kind, sender, root, channel, operation, chunk, count), payload


def pack_ranges(ranges: list[tuple[int, int]], limit: int) -> bytes:
    """Half-open chunk ranges ``[(start, stop), ...]``, as many as fit ``limit`` bytes."""
    fit = ranges[: max(1, limit // _RANGE.size)]
    return b"".join(_RANGE.pack(start, stop) for start, stop in fit)


def unpack_ranges(payload) -> list[tuple[int, int]]:
    if len(payload) % _RANGE.size:
        raise Refused("truncated")
    return [_RANGE.unpack_from(payload, at) for at in range(0, len(payload), _RANGE.size)]
