"""Real clients: a small Hugging Face GPT-2 and Llama (random init, built from configs:
nothing is downloaded), trained with FSDP2 and with DDP, compressed and not."""

from __future__ import annotations

import contextlib
import importlib.util
import os

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

import commpress as cp
from commpress.cluster.local import run_distributed

if importlib.util.find_spec("transformers") is None:  # in the `dev` extra, pinned
    pytest.skip("needs transformers", allow_module_level=True)

STEPS = 2
VOCAB, CONTEXT = 256, 32


def gpt2() -> torch.nn.Module:
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers  # in the ranks only: the test process need not pay for it

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=CONTEXT
    )
    return transformers.GPT2LMHeadModel(config)  # its lm_head is tied to wte


def llama() -> torch.nn.Module:
    """Grouped-query attention, rotary embeddings (a buffer), RMSNorm, untied head."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def train_accumulating(model, rank: int, sync) -> list[torch.Tensor]:
    """SGD steps of two micro-batches, the first without gradient sync (``sync(False)``
    returns the context to run it in), and a no_grad eval forward after each step; every
    parameter after each step, read from the optimizer's (sharded) ones."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    snapshots = []
    for step in range(STEPS):
        for micro in range(2):
            generator = torch.Generator().manual_seed(100 * step + 10 * rank + micro)
            tokens = torch.randint(0, VOCAB, (2, CONTEXT), generator=generator)
            with sync(micro == 1):
                model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            model(input_ids=tokens)
        model.train()
        snapshots.append(_parameters(optimizer.param_groups[0]["params"]))
    return snapshots


def _llama_fsdp(spec):
    model, mesh = llama(), cp.fsdp.cpu_mesh()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for module in (*model.model.layers, model):
        fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    if spec is not None:
        cp.fsdp.compress(model, all_gather=spec, reduce_scatter=spec)

    def sync(on):
        model.set_requires_gradient_sync(on)
        return contextlib.nullcontext()

    return model, sync


def _llama_ddp(spec):
    model = DistributedDataParallel(
        llama(), find_unused_parameters=True, gradient_as_bucket_view=True, bucket_cap_mb=0.05
    )
    if spec is not None:
        model.register_comm_hook(*cp.ddp.hook(spec))
    return model, lambda on: contextlib.nullcontext() if on else model.no_sync()


def train(model, rank: int, negate=False) -> tuple[list[float], list[torch.Tensor]]:
    """SGD steps on random tokens; the losses and every parameter after each step (full
    tensors: FSDP's are gathered). ``negate``: the broken variant, each reduced gradient
    negated before the step, as a reduce-scatter of the wrong sign would hand it over."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, snapshots = [], []
    for step in range(STEPS):
        generator = torch.Generator().manual_seed(100 * step + rank)
        tokens = torch.randint(0, VOCAB, (4, CONTEXT), generator=generator)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        if negate:
            for parameter in model.parameters():
                parameter.grad.neg_()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        snapshots.append(_parameters(model))
    return losses, snapshots


def _parameters(model) -> torch.Tensor:
    """``model``'s parameters (or those given), as one flat tensor."""
    parameters = model.parameters() if isinstance(model, torch.nn.Module) else model
    flat = []
    for parameter in parameters:
        full = parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter
        flat.append(full.detach().reshape(-1).clone())
    return torch.cat(flat)


def _fsdp(spec):
    model = gpt2()
    mesh = cp.fsdp.cpu_mesh()
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if spec is not None:
        model.compression = cp.fsdp.compress(model, all_gather=spec, reduce_scatter=spec)
    return model


def _ddp(spec):
    model = gpt2()
    ddp = DistributedDataParallel(model)
    if spec is not None:
        ddp.hook_state, hook = cp.ddp.hook(spec)
        ddp.register_comm_hook(ddp.hook_state, hook)
    return ddp


def _runs(rank, world_size):
    """Every training of the file in one job: each rank imports transformers once."""
    fsdp, ddp, calls = {}, {}, {}  # calls: that commpress's path ran at all
    for spec in (None, "none", "int8"):
        model = _fsdp(spec)
        fsdp[spec] = train(model, rank)
        if spec is not None:
            stats = model.compression.all_gather, model.compression.reduce_scatter
            calls[f"fsdp {spec}"] = min(s.snapshot()["calls"] for s in stats)
    fsdp["int8-negated"] = train(_fsdp("int8"), rank, negate=True)
    fsdp["unreduced"] = train(gpt2(), rank)  # each rank steps on its own gradient alone
    for spec in (None, "none"):
        model = _ddp(spec)
        ddp[spec] = train(model, rank)
        if spec is not None:
            calls[f"ddp {spec}"] = model.hook_state.stats.snapshot()["calls"]
    for trained, make in ((fsdp, _llama_fsdp), (ddp, _llama_ddp)):
        for spec in (None, "none"):
            model, sync = make(spec)
            trained[f"llama {spec}"] = train_accumulating(model, rank, sync)
    return fsdp, ddp, _parameters(gpt2()), calls


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_runs, 2, timeout=300)


def _updates(snapshots, start):
    previous = start
    for snapshot in snapshots:
        yield snapshot - previous
        previous = snapshot


def _assert_same_bits(run, plain) -> None:
    (losses, params), (plain_losses, plain_params) = run, plain
    assert losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(params, plain_params, strict=True))


@pytest.mark.parametrize("wrapper", ["fsdp", "ddp"])
def test_none_trains_gpt2_to_the_plain_wrappers_bits(runs, wrapper):
    for fsdp, ddp, _, _ in runs:
        trained = fsdp if wrapper == "fsdp" else ddp
        _assert_same_bits(trained["none"], trained[None])


@pytest.mark.parametrize("wrapper", ["fsdp", "ddp"])
def test_none_trains_llama_to_the_plain_wrappers_bits_on_every_rank(runs, wrapper):
    """Llama under FSDP2 (bf16 parameters, fp32 reduction, no resharding after forward) and
    DDP (unused-parameter search, gradients as bucket views, small buckets), each with a
    micro-batch without gradient sync and a no_grad eval forward after every step."""
    trained = [fsdp if wrapper == "fsdp" else ddp for fsdp, ddp, _, _ in runs]
    for by_rank in trained:
        plain, compressed = by_rank["llama None"], by_rank["llama none"]
        assert all(torch.equal(a, b) for a, b in zip(compressed, plain, strict=True))
    assert torch.equal(trained[0]["llama none"][-1], trained[1]["llama none"][-1])


def test_fsdp_int8_updates_gpt2_as_plain_fsdp_does(runs):
    """The first step's update against plain FSDP's from the same start: the same direction
    (cosine above 0.99) and size (within 5%); two broken variants are checked to fail it:
    the gradients negated, and no reduction at all (each rank's own gradient: cosine about
    0.7 with the mean on these random tokens)."""
    for fsdp, _, start, _ in runs:
        plain = list(_updates(fsdp[None][1], start))
        for spec, agrees in (("int8", True), ("int8-negated", False), ("unreduced", False)):
            updates = list(_updates(fsdp[spec][1], start))
            first, reference = updates[0], plain[0]  # the same start: comparable exactly
            cosine = torch.nn.functional.cosine_similarity(first, reference, dim=0).item()
            ratio = (first.norm() / reference.norm()).item()
            assert (cosine > 0.99 and abs(ratio - 1) < 0.05) == agrees, (spec, cosine, ratio)


def test_the_compressed_runs_went_through_commpress(runs):
    """Else the bit-for-bit tests above would pass with a compress that did nothing."""
    for *_, calls in runs:
        assert set(calls) == {"fsdp none", "fsdp int8", "ddp none"}
        assert all(count > 0 for count in calls.values()), calls
