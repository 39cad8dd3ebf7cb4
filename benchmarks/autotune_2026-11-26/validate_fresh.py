"""The cost model against this session's calibration rows, fitted on them (in sample) and
on the 4-host rows alone (predicting the 8-host rows it has not seen); the table and the
share of rows within 10% from 4 MiB (`../sim_2026-11-25/validate.py`, on these files only).

    python benchmarks/autotune_2026-11-26/validate_fresh.py \
        > benchmarks/autotune_2026-11-26/validation.md
"""

from __future__ import annotations

import glob
import sys

sys.path.insert(0, "benchmarks/sim_2026-11-25")
import validate  # noqa: E402

if __name__ == "__main__":
    validate.FILES = sorted(glob.glob("benchmarks/autotune_2026-11-26/calib_*.json"))
    validate.main()
