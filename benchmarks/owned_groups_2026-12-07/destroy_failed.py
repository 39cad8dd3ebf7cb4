import os, time, threading, sys
from datetime import timedelta
import torch, torch.distributed as dist
from commpress.cluster.local import run_distributed

def fds(): return len(os.listdir("/proc/self/fd"))

def body(rank, world):
    g = dist.new_group([0, 1], timeout=timedelta(seconds=1))
    dist.barrier()
    out = {}
    if rank == 1:
        time.sleep(4)
        return None
    before = (fds(), threading.active_count(), len(os.listdir("/proc/self/task")))
    try:
        dist.all_reduce(torch.ones(4), group=g)
    except Exception as e:
        out["err"] = type(e).__name__
    t = time.monotonic()
    dist.destroy_process_group(g)
    import gc; del g; gc.collect()
    out["destroy_s"] = round(time.monotonic() - t, 3)
    time.sleep(0.5)
    after = (fds(), threading.active_count(), len(os.listdir("/proc/self/task")))
    out["before"], out["after"] = before, after
    return out

if __name__ == "__main__":
    print(run_distributed(body, 2, timeout=60))
