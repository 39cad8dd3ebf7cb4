"""``benchmarks/sim_2026-11-25/validate.py`` (the cost model against every emulated
measurement, fitted per machine) with the multicast rows measured since on the batched,
native-receive path added: ``../multicast_2026-11-26/`` and ``sweep/`` beside this file.

    python benchmarks/multicast_check_2026-11-26/validate_with_new_rows.py \
        > benchmarks/multicast_check_2026-11-26/validation.md
"""

from __future__ import annotations

import glob
import sys

sys.path.insert(0, "benchmarks/sim_2026-11-25")
import validate  # noqa: E402

NEW = (
    "benchmarks/multicast_2026-11-26/*_mtu*.json",
    "benchmarks/multicast_check_2026-11-26/sweep/*.json",
)

if __name__ == "__main__":
    validate.FILES = sorted(set(validate.FILES).union(*(glob.glob(p) for p in NEW)))
    validate.main()
