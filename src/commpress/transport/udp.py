"""UDP sockets for the reliable multicast: one joined to the communicator's group, one for
sending (to the group, and to single peers) and for receiving what peers send this rank.

Both sockets are bound to the interface that carries ``local_address``: multicast leaves
through it (``IP_MULTICAST_IF``) with TTL 1 by default (one layer-2 network, as the emulated
cluster's), and is received on it only (``IP_ADD_MEMBERSHIP`` with that address). A rank's
own multicast is not looped back unless another rank shares its address; the protocol
drops its own datagrams by their sender field either way.

Consecutive datagrams of a broadcast leave in one system call where the kernel segments
them (UDP segmentation offload, ``UDP_SEGMENT``), and arrive in one where it coalesces them
(``UDP_GRO``): each datagram is still a datagram on the wire, with its own header and
checksum, but the stack (and, on the emulated cluster, every port of the bridge) handles
a batch at once. Where the kernel lacks either (UDP_SEGMENT: Linux 4.18, probed at setup;
UDP_GRO: 5.0), or refuses a segmented send once, datagrams go one by one from then on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import selectors
import socket
import struct
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from commpress.transport.datagrams import FRAME_OVERHEAD

_SIOCGIFFLAGS, _SIOCGIFADDR, _SIOCGIFMTU = 0x8913, 0x8915, 0x8921
_IFF_UP, _IFF_MULTICAST = 0x1, 0x1000
#: Receive buffer asked for each socket: several milliseconds of a fast link, so that a
#: burst from the roots sending at once waits there rather than being dropped.
RECEIVE_BUFFER_BYTES = 8 << 20
#: SO_RCVBUF past net.core.rmem_max, where the process may (root): Linux's, which Python's
#: socket module does not name.
_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33 if sys.platform == "linux" else None)
_DRAIN_AT_MOST = 512  # datagrams handled per socket and wait before the caller gets to send
# UDP segmentation offload (Linux 4.18+): one sendmsg of several equal datagrams back to
# back, which the kernel cuts (in the NIC, where it can) instead of each taking its own
# trip through the stack; for a multicast, through every port of a software bridge.
_SOL_UDP, _UDP_SEGMENT = 17, 103
# ... and its twin on receipt (Linux 5.0+): datagrams that travelled segmented come up in
# one read, with their size in a control message.
_UDP_GRO = 104
_GRO_CONTROL = socket.CMSG_SPACE(4)
_SEGMENT_SIZE = struct.Struct("i")
_SEGMENTS_AT_MOST = 64  # the kernel's UDP_MAX_SEGMENTS (64 before Linux 5.5)
# A batch is one buffer in the stack until it is cut: kept under 64 KiB with every
# datagram's IP, UDP and Ethernet headers, so that a shaper whose bucket holds 64 KiB (tbf
# cuts a larger one, at a cost) passes it whole.
_SEGMENTED_FRAME_BYTES = 60000
#: errnos of a full local queue: the datagrams are lost, as on the wire, and repaired
_QUEUE_FULL = (errno.ENOBUFS, errno.EAGAIN)
#: errnos that say this socket, route or kernel cannot segment: datagrams go one by one
_NO_SEGMENTATION = (errno.EINVAL, errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP)


class MulticastSetupError(RuntimeError):
    """The multicast transport cannot be set up here; the message says what to change."""


def interface_of(address: str) -> tuple[str, int]:
    """``(name, mtu)`` of the interface that holds IPv4 ``address``; MulticastSetupError
    when no interface does, or it is down or cannot multicast."""
    for _, name in socket.if_nameindex():
        if _interface_address(name) != address:
            continue
        flags = struct.unpack_from("H", _ifreq(name, _SIOCGIFFLAGS), 16)[0]
        if not flags & _IFF_UP:
            raise MulticastSetupError(f"interface {name} ({address}) is down")
        if not flags & _IFF_MULTICAST:
            raise MulticastSetupError(
                f"interface {name} ({address}) cannot multicast (no MULTICAST flag): use "
                "another interface (COMMPRESS_MULTICAST_ADDRESS), another algorithm, or, "
                "on one machine, the emulated cluster (commpress launch --hosts N, "
                "commpress.cluster.Emulated), whose hosts multicast"
            )
        mtu = struct.unpack_from("i", _ifreq(name, _SIOCGIFMTU), 16)[0]
        return name, mtu
    raise MulticastSetupError(f"no interface of this host has the address {address}")


def route_source(peer: str) -> str:
    """The address this host sends from to reach ``peer`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((peer, 9))
        except OSError as error:
            raise MulticastSetupError(f"no route to {peer}: {error}") from None
        return probe.getsockname()[0]


def _ifreq(name: str, request: int) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        return fcntl.ioctl(probe.fileno(), request, struct.pack("256s", name.encode()[:15]))


def _interface_address(name: str) -> str | None:
    try:
        return socket.inet_ntoa(_ifreq(name, _SIOCGIFADDR)[20:24])
    except OSError:  # no IPv4 address
        return None


class UdpNetwork:
    """The :class:`~commpress.transport.reliable_broadcast.Network` over UDP multicast.

    Built in two steps, since peers learn each other's ports only once every rank has
    bound its sockets: ``UdpNetwork(...)``, then :meth:`connect` with every rank's
    ``(address, port)`` (:attr:`unicast_address`).
    """

    #: Orders :meth:`wake`'s write with :meth:`close`'s closing of the pipe (one for every
    #: network: both are rare and short).
    _wake_lock = threading.Lock()

    def __init__(
        self,
        rank: int,
        world_size: int,
        local_address: str,
        group: tuple[str, int],
        *,
        shared_host: bool = False,
        ttl: int = 1,
    ):
        self.rank, self.world_size, self.group = rank, world_size, group
        self.interface, self.mtu = interface_of(local_address)
        self._peers: list[tuple[str, int]] = []
        self._segmentation = True  # until the kernel refuses it once (probed below)
        self.send_calls = self.read_calls = 0  # system calls, against the datagrams they move
        self.send_drops = 0  # datagrams the local queue refused (lost, to be repaired)
        self._sockets: list[socket.socket] = []
        try:
            self._joined = self._socket()
            if shared_host:  # several ranks of this host receive the same group and port
                self._joined.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._bind(self._joined, group, "the multicast group's port")
            membership = socket.inet_aton(group[0]) + socket.inet_aton(local_address)
            self._joined.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
            self._own = self._socket()
            self._bind(self._own, (local_address, 0), "a unicast port")
            interface = socket.inet_aton(local_address)
            self._own.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, interface)
            self._own.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
            self._own.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, int(shared_host))
            self._segmentation = _kernel_segments(self._own)
            self._wake_read, self._wake_write = os.pipe()
            os.set_blocking(self._wake_read, False)
            os.set_blocking(self._wake_write, False)
            if self.receive_buffer_bytes < RECEIVE_BUFFER_BYTES:
                warnings.warn(  # raises where warnings are errors: the sockets close below
                    f"commpress multicast: receive buffers are {self.receive_buffer_bytes} "
                    f"bytes, not {RECEIVE_BUFFER_BYTES} (not root, and net.core.rmem_max is "
                    "lower): bursts will be dropped and repaired; raise net.core.rmem_max",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self._selector = selectors.DefaultSelector()  # a descriptor too (EMFILE)
            for sock in self._sockets:
                self._selector.register(sock, selectors.EVENT_READ)
            self._selector.register(self._wake_read, selectors.EVENT_READ)
        except BaseException:
            self.close()
            raise
        self._buffer = bytearray(65536)

    def _socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sockets.append(sock)
        with contextlib.suppress(OSError):  # an older kernel: one datagram per read
            sock.setsockopt(_SOL_UDP, _UDP_GRO, 1)
        for option in (_SO_RCVBUFFORCE, socket.SO_RCVBUF):
            if option is None:
                continue
            try:  # FORCE passes net.core.rmem_max where we may (as root)
                sock.setsockopt(socket.SOL_SOCKET, option, RECEIVE_BUFFER_BYTES)
                break
            except PermissionError:
                continue
        return sock

    @staticmethod
    def _bind(sock: socket.socket, address: tuple[str, int], what: str) -> None:
        try:
            sock.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise MulticastSetupError(
                    f"{what} {address[0]}:{address[1]} is already in use (another communicator "
                    "or program): pick another with COMMPRESS_MULTICAST_GROUP=ADDRESS:PORT"
                ) from None
            raise MulticastSetupError(f"cannot bind {what} {address}: {error}") from None

    @property
    def unicast_address(self) -> tuple[str, int]:
        return self._own.getsockname()

    @property
    def receive_buffer_bytes(self) -> int:
        """What the kernel granted of :data:`RECEIVE_BUFFER_BYTES` (Linux reports twice it)."""
        reported = self._joined.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        return reported // 2 if sys.platform == "linux" else reported

    def connect(self, peers: list[tuple[str, int]]) -> None:
        if len(peers) != self.world_size:
            raise ValueError(f"peers must list {self.world_size} addresses, got {len(peers)}")
        self._peers = [tuple(peer) for peer in peers]

    def multicast(self, head: bytes, payload) -> None:
        self._send(head, payload, self.group)

    def batch_limit(self, datagram_bytes: int) -> int:
        """How many datagrams of ``datagram_bytes`` :meth:`multicast_many` sends in one call."""
        if not self._segmentation:
            return 1
        per_frame = datagram_bytes + FRAME_OVERHEAD
        return max(1, min(_SEGMENTS_AT_MOST, _SEGMENTED_FRAME_BYTES // per_frame))

    def multicast_many(self, datagrams: Sequence[tuple[bytes, Any]]) -> None:
        """Multicast ``datagrams`` (``(head, payload)`` each, every one but the last of the
        same size, at most :meth:`batch_limit`), in order, in one system call where the
        kernel segments them; one by one where it cannot (learnt at the first refusal)."""
        sizes = [len(head) + len(payload) for head, payload in datagrams]
        if len(datagrams) > 1 and self._segmentation and _segmentable(sizes):
            size = sizes[0]
            parts = [part for datagram in datagrams for part in datagram]
            control = [(_SOL_UDP, _UDP_SEGMENT, struct.pack("H", size))]
            try:
                self._own.sendmsg(parts, control, 0, self.group)
                self.send_calls += 1
                return
            except OSError as error:
                if error.errno in _QUEUE_FULL:
                    self.send_drops += len(datagrams)  # every one lost, to be repaired
                    return
                if error.errno not in _NO_SEGMENTATION:
                    raise
                self._segmentation = False
        for head, payload in datagrams:
            self._send(head, payload, self.group)

    def unicast(self, rank: int, head: bytes, payload) -> None:
        self._send(head, payload, self._peers[rank])

    def _send(self, head: bytes, payload, address) -> None:
        try:
            self._own.sendmsg([head, payload], (), 0, address)
            self.send_calls += 1
        except OSError as error:  # a full local queue drops the datagram: loss, repaired
            if error.errno not in _QUEUE_FULL:
                raise
            self.send_drops += 1

    def receive(self, timeout: float, handle: Callable[[memoryview, int], None]) -> None:
        view = memoryview(self._buffer)
        for key, _ in self._selector.select(timeout):
            if key.fileobj == self._wake_read:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_read, 4096)
                continue
            sock, handled = key.fileobj, 0
            while handled < _DRAIN_AT_MOST:
                try:
                    size, control, _, _ = sock.recvmsg_into(
                        [self._buffer], _GRO_CONTROL, socket.MSG_DONTWAIT
                    )
                except BlockingIOError:
                    break
                self.read_calls += 1
                segment = _segment_size(control) or size
                handle(view[:size], segment)
                handled += -(-size // segment) if segment else 1

    def wake(self) -> None:
        with self._wake_lock:  # not while close() closes the pipe: its number may be reused
            if self._wake_write is None:  # closed
                return
            with contextlib.suppress(BlockingIOError):  # already woken
                os.write(self._wake_write, b"x")

    def close(self) -> None:
        if getattr(self, "_selector", None) is not None:
            self._selector.close()
            self._selector = None
        for sock in self._sockets:
            sock.close()
        self._sockets = []
        with self._wake_lock:
            for name in ("_wake_read", "_wake_write"):
                descriptor = getattr(self, name, None)
                if descriptor is not None:
                    os.close(descriptor)
                    setattr(self, name, None)


def _kernel_segments(sock: socket.socket) -> bool:
    """Whether this kernel knows UDP_SEGMENT (4.18+); an older one would ignore the
    control message and send a batch as one fragmented datagram."""
    try:
        sock.getsockopt(_SOL_UDP, _UDP_SEGMENT)
    except OSError:
        return False
    return True


def _segmentable(sizes: list[int]) -> bool:
    """Whether the kernel cuts datagrams of these sizes back apart: all of one size but the
    last, which may be shorter."""
    return all(size == sizes[0] for size in sizes[:-1]) and 0 < sizes[-1] <= sizes[0]


def _segment_size(control: list[tuple[int, int, bytes]]) -> int | None:
    """The size of each datagram of a coalesced read, from its control message."""
    for level, kind, data in control:
        if level == _SOL_UDP and kind == _UDP_GRO and len(data) >= _SEGMENT_SIZE.size:
            return _SEGMENT_SIZE.unpack_from(data)[0]
    return None
