"""The CPU time one compressed ring call costs the library itself, in one process, with
every transfer looped back: a figure that the noise of a shared machine does not move,
to track the per-call overhead that dominates small messages (on an idle machine: run
nothing else meanwhile).

``python benchmarks/small_messages_2026-11-26/call_cpu.py [SIZE...]`` (no root, no
cluster; SIZE bytes of the fp32 all-gather output and reduce-scatter input, default 1 MiB
and 16 MiB). One process plays rank 1 of 4: torch.distributed's group queries are
answered by a stand-in group, each send is copied into the oldest receive posted and not
yet filled (every rank of a ring sends the same sizes, so the in-band argument check sees
agreeing headers), and an all-reduce (the early verdict's) leaves its input as it is.
Rows, in microseconds of process CPU per call (the best of 5 repeats of ITERATIONS calls):

* ``public``: ``cp.all_gather_into_tensor`` / ``cp.reduce_scatter_tensor`` as a user
  calls them (argument checks, the hand-over to the communication thread and back, the
  in-band check);
* ``executor``: the same schedule run on the calling thread without the argument check;
* ``codec``: only the codec calls the schedule makes, through the codec's public
  ``encode``/``decode`` (their Python wrappers included): one encode and four decodes for
  the all-gather; for the reduce-scatter one encode, then three decodes (each added to,
  and re-encoded but the last).
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

WORLD, RANK = 4, 1
ITERATIONS = 400


class _Group(dist.ProcessGroup):
    """What the collectives ask of a process group, answered for rank 1 of 4 (a
    ``ProcessGroup``, which the collectives' argument check requires)."""

    def __init__(self):
        super().__init__(RANK, WORLD)


class _LoopedBack:
    """A point-to-point batch whose sends land in the receives posted so far, oldest first
    (receives are posted ahead of the sends that fill them)."""

    posted: list[torch.Tensor] = []  # receives not yet filled, in the order posted

    def __init__(self, group, sends, receives):
        _LoopedBack.posted.extend(received for received, _ in receives)
        for sent, _ in sends:
            received = _LoopedBack.posted.pop(0)
            size = min(sent.numel(), received.numel())  # a first message's buffer is larger
            received[:size].copy_(sent[:size])

    def wait(self, timeout=None) -> None:
        pass

    def is_completed(self) -> bool:
        return True


def _stand_in() -> _Group:
    dist.get_world_size = lambda group=None: WORLD
    dist.get_rank = lambda group=None: RANK
    dist.get_backend = lambda group=None: "gloo"
    from commpress.collectives import executor, inband
    from commpress.transport import collective

    executor.p2p.Batch = inband.p2p.Batch = _LoopedBack
    # the early verdict's all-reduce (8 MiB and up) of digests that agree: already reduced
    collective.all_reduce = lambda tensor, op, group: _LoopedBack(group, [], [])
    return _Group()


def _cpu_per_call(call) -> float:
    for _ in range(20):
        call()
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(ITERATIONS):
            call()
        best = min(best, (time.process_time() - start) / ITERATIONS)
    return best * 1e6


def _calls(group, op: str, size: int) -> dict:
    import commpress as cp
    from commpress.codecs import get_codec
    from commpress.collectives.all_gather import gather
    from commpress.collectives.reduce_scatter import reduce
    from commpress.schedules.payloads import DEFAULT_CHUNK_BYTES

    codec = get_codec("int8")
    chunk = size // 4 // WORLD
    chunk_in, payload = torch.randn(chunk), codec.encode(torch.randn(chunk))
    decoded = torch.empty(chunk)
    if op == "all_gather":
        inp, out = torch.randn(chunk), torch.empty(chunk * WORLD)

        def codec_calls():
            codec.encode(inp, out=payload)
            for _ in range(WORLD):
                codec.decode(payload, chunk, torch.float32, out=decoded)

        return {
            "public": lambda: cp.all_gather_into_tensor(out, inp, group, codec=codec),
            "executor": lambda: gather(out, inp, group, codec, "ring", None, stream_output=True),
            "codec": codec_calls,
        }
    inp, out = torch.randn(chunk * WORLD), torch.empty(chunk)

    def codec_calls():
        codec.encode(chunk_in, out=payload)
        for hop in range(WORLD - 1):
            codec.decode(payload, chunk, torch.float32, out=decoded)
            decoded.add_(chunk_in)
            if hop < WORLD - 2:  # the last hop keeps its sum
                codec.encode(decoded, out=payload)

    return {
        "public": lambda: cp.reduce_scatter_tensor(out, inp, group=group, codec=codec),
        "executor": lambda: reduce(inp, group, codec, "ring", DEFAULT_CHUNK_BYTES, None, None),
        "codec": codec_calls,
    }


def main() -> None:
    sizes = [int(s) for s in sys.argv[1:]] or [1 << 20, 16 << 20]
    torch.set_num_threads(1)
    group = _stand_in()
    print(f"rank {RANK} of {WORLD}, int8 ring, transfers looped back: us of CPU per call")
    print("| op | size (B) | public | executor | codec |")
    print("|---|---:|---:|---:|---:|")
    for op in ("all_gather", "reduce_scatter"):
        for size in sizes:
            row = {name: _cpu_per_call(call) for name, call in _calls(group, op, size).items()}
            print(
                f"| {op} | {size} | {row['public']:.0f} | {row['executor']:.0f} | "
                f"{row['codec']:.0f} |"
            )


if __name__ == "__main__":
    main()
