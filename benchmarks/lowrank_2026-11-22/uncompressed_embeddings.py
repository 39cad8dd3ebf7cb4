"""Experiment: PowerSGD and ACP-SGD with the embeddings and the output head uncompressed.

Registers ``powersgdnoemb`` and ``acpsgdnoemb`` (the demo GPT's 256x128 and 64x128
matrices stay uncompressed), then runs ``commpress`` with the given arguments, e.g.
``python uncompressed_embeddings.py train --strategy ddp --steps 400 --compare plain
powersgdnoemb:rank=4 acpsgdnoemb:rank=4``. Worker processes re-import this file, so the
registration happens there too.
"""

import sys

import commpress.train.loop as loop
from commpress.cli import main
from commpress.lowrank import registry
from commpress.lowrank.acpsgd import ACPSGD
from commpress.lowrank.powersgd import PowerSGD

EMBEDDINGS = {(256, 128), (64, 128)}  # token embedding and head, position embedding


class PowerSGDNoEmb(PowerSGD):
    name = "powersgdnoemb"

    def compresses(self, n, m):
        return (n, m) not in EMBEDDINGS and super().compresses(n, m)


class ACPSGDNoEmb(ACPSGD):
    name = "acpsgdnoemb"

    def compresses(self, n, m):
        return (n, m) not in EMBEDDINGS and super().compresses(n, m)


registry.ALGORITHMS.update({"powersgdnoemb": PowerSGDNoEmb, "acpsgdnoemb": ACPSGDNoEmb})
loop.LOWRANK_NAMES = tuple(registry.ALGORITHMS)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
