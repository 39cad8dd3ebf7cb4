"""docs/fsdp-ddp.md, "Checkpoints and resumed runs": an explicit module.unshard() under
cp.fsdp.compress(model, all_gather="int4", reduce_scatter="int8") leaves the codec's
parameters on the module. The setting of tests/distributed/test_fsdp.py::
test_state_dicts_hold_the_exact_weights_while_unshard_holds_the_codecs (its small_model,
world size 2); prints, per parameter, the largest |unsharded - exact| over both ranks.

Run: PYTHONPATH=src python benchmarks/docs_figures_2026-12-07/claim3_unshard_int4.py
"""

import warnings

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

import commpress as cp
from commpress.cluster.local import run_distributed


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10)
    )


def distances(rank, world_size):
    warnings.filterwarnings("ignore", category=FutureWarning)
    exact = small_model().state_dict()
    model = small_model()
    for layer in (model[0], model[2], model[4], model):
        fully_shard(layer, mesh=cp.fsdp.cpu_mesh())
    cp.fsdp.compress(model, all_gather="int4", reduce_scatter="int8")
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.unshard()
    return {
        name: (parameter.detach() - exact[name]).abs().max().item()
        for name, parameter in model.named_parameters()
    }


def main():
    by_rank = run_distributed(distances, 2, timeout=300)
    print("world size 2, int4 all-gather; largest |unsharded - exact| over both ranks")
    for name in by_rank[0]:
        print(f"{name}: {max(found[name] for found in by_rank):.3g}")
    print(f"all parameters: {max(max(found.values()) for found in by_rank):.3g}")


if __name__ == "__main__":
    main()
