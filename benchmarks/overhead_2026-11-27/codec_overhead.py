import time, torch, statistics, sys
torch.set_num_threads(1)
from commpress.codecs import get_codec
def per_call(f, k):
    for _ in range(20): f()
    runs = []
    for _ in range(5):
        t = time.thread_time()
        for _ in range(k): f()
        runs.append((time.thread_time() - t) / k * 1e6)
    return statistics.median(runs)
for spec in ("int8", "int4", "fp8"):
    c = get_codec(spec)
    for n in (16384, 65536):
        x = torch.randn(n); p = c.encode(x); out = torch.empty(n)
        d = per_call(lambda: c.decode(p, n, torch.float32, out=out), 2000)
        e = per_call(lambda: c.encode(x, out=p), 2000)
        print(f"{spec} n={n}: decode {d:.1f} us, encode {e:.1f} us")
