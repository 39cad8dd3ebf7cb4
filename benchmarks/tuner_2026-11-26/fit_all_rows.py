"""The model fitted on every explicit row measured on this VM in the last two sessions
(the four calibration files, section 1's sweep and section 4's), in sample by host count
(rows of 4 MiB and above within 10%), and the tuner's reduce-scatter choices with that fit
at the sizes `small_pairs.py` measured paired.

    python benchmarks/tuner_2026-11-26/fit_all_rows.py \
        > benchmarks/tuner_2026-11-26/fit_all_rows.txt
"""

import collections
import glob
import sys

import torch

sys.path.insert(0, "benchmarks/sim_2026-11-25")
import validate  # noqa: E402

from commpress.sim import calibrate, tuner  # noqa: E402

HERE = "benchmarks/tuner_2026-11-26"
FILES = (
    sorted(glob.glob("benchmarks/autotune_2026-11-26/calib_*.json"))
    + sorted(glob.glob(f"{HERE}/sweep_*.json"))
    + [f"{HERE}/auto_reduce_scatter_8racks.json"]
)
FIT = f"{HERE}/fit_all_rows.json"


def main() -> None:
    rows = calibrate.read_bench(FILES)
    fields = calibrate.fit_rows(rows, calibrate.codec_speeds(validate.CODECS))
    calibrate.save(FIT, fields)
    print(f"{len(rows)} rows; {calibrate.describe(fields)}")
    within, total = collections.Counter(), collections.Counter()
    for row, predicted in validate.predict(rows, fields):
        if row.size_bytes >= 4 << 20:
            total[row.topology.nodes] += 1
            within[row.topology.nodes] += abs(predicted / row.time_s - 1) <= 0.10
    for hosts in sorted(total):
        print(f"{hosts} hosts: {within[hosts]}/{total[hosts]} rows of 4 MiB and above within 10%")
    for topology, hosts in (("racks:count=2,uplink=500mbit", 8), ("switch", 4), ("switch", 2)):
        tuner.configure(topology=topology, link="1gbit", fit=FIT, shared_cores=2)
        for size in (1 << 20, 4 << 20):
            for codec in ("int8", "int4"):
                choice = tuner.choose("reduce_scatter", size // 4, torch.float32, hosts, codec)
                print(f"{hosts} hosts, {topology}, {size >> 20} MiB, {codec}: {choice}")


if __name__ == "__main__":
    main()
