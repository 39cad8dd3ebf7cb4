"""cp.fsdp.compress against plain FSDP2 and a hand-written data-parallel reference (gloo)."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

import commpress as cp
from commpress.testing.distributed import DistributedError, run_distributed

STEPS = 4


def small_model(dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10)
    ).to(dtype)


def shard(model: nn.Module, policy=None) -> nn.Module:
    policy = policy or MixedPrecisionPolicy()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def data(rank: int, step: int, micro: int = 0):
    generator = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    return torch.randn(16, 32, generator=generator), torch.randint(
        0, 10, (16,), generator=generator
    )


def train(model, rank, steps=STEPS, accumulate=1, lr=0.05):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        for micro in range(accumulate):
            if accumulate > 1:
                model.set_requires_gradient_sync(micro == accumulate - 1)
            x, y = data(rank, step, micro)
            loss = F.cross_entropy(model(x).float(), y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
    return losses


def unsharded_parameters(model) -> list[torch.Tensor]:
    """What the all-gathers produced: each FSDP module's unsharded parameters, as plain tensors."""
    values = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.unshard()
            for group in module._get_fsdp_state()._fsdp_param_groups:
                values += [p.unsharded_param.detach().clone() for p in group.fsdp_params]
            module.reshard()
    return values


def _scenarios(rank, world_size):
    results = {}

    def run(key, spec=None, policy=None, accumulate=1, dtype=torch.float32, force_sum=False, **kw):
        model = shard(small_model(dtype), policy)
        if force_sum:
            for module in model.modules():
                if hasattr(module, "set_force_sum_reduction_for_comms"):
                    module.set_force_sum_reduction_for_comms(True)
        if spec is not None:
            cp.fsdp.compress(model, *spec, **kw)
        losses = train(model, rank, accumulate=accumulate)
        results[key] = (losses, unsharded_parameters(model))

    run("plain")
    run("none", ("none", "none"))
    run("int8", ("int8", "int8"))
    run("int8-alltoall-ef", ("int8", "int8@alltoall"), error_feedback=True)
    run("plain-accumulate", accumulate=2)
    run("none-accumulate", ("none", "none"), accumulate=2)
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    run("plain-bf16", policy=bf16)
    run("none-bf16", ("none", "none"), policy=bf16)
    run("int8-bf16", ("int8", "int8"), policy=bf16)
    run("plain-sum", force_sum=True)
    run("none-sum", ("none", "none"), force_sum=True)
    return results


@pytest.fixture(scope="module")
def scenarios():
    return run_distributed(_scenarios, 2, timeout=300)


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    ("compressed", "plain"),
    [
        ("none", "plain"),
        ("none-accumulate", "plain-accumulate"),
        ("none-bf16", "plain-bf16"),
        ("none-sum", "plain-sum"),
    ],
)
def test_uncompressed_specs_match_plain_fsdp_bit_for_bit(scenarios, compressed, plain):
    for rank_results in scenarios:
        losses, params = rank_results[compressed]
        plain_losses, plain_params = rank_results[plain]
        assert losses == plain_losses
        assert same(params, plain_params)


@pytest.mark.parametrize(
    ("compressed", "plain"),
    [("int8", "plain"), ("int8-bf16", "plain-bf16"), ("int8-alltoall-ef", "plain")],
)
def test_int8_training_stays_within_two_percent_of_plain(scenarios, compressed, plain):
    losses, _ = scenarios[0][compressed]
    plain_losses, _ = scenarios[0][plain]
    assert losses != plain_losses  # really compressed
    assert abs(losses[-1] / plain_losses[-1] - 1) < 0.02


@pytest.mark.parametrize("key", ["int8", "int8-bf16", "int8-alltoall-ef"])
def test_every_rank_holds_bitwise_identical_parameters_after_all_gather(scenarios, key):
    assert same(scenarios[0][key][1], scenarios[1][key][1])


def _manual_reference(rank, world_size):
    """The same model trained by averaging full gradients with all_reduce by hand."""
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = data(rank, step)
        F.cross_entropy(model(x), y).backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= world_size
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def test_uncompressed_fsdp_matches_a_manual_all_reduce_reference(scenarios):
    reference = run_distributed(_manual_reference, 2, timeout=120)[0]
    for got, want in zip(scenarios[0]["none"][1], reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def _misuse(rank, world_size):
    errors = {}

    def error_of(action):
        try:
            action()
        except (ValueError, TypeError) as error:
            return type(error).__name__, str(error)
        return None

    errors["unknown codec"] = error_of(lambda: cp.fsdp.compress(shard(small_model()), "int9"))
    errors["unknown algorithm"] = error_of(
        lambda: cp.fsdp.compress(shard(small_model()), "int8", "int8@tree")
    )
    errors["no fsdp"] = error_of(lambda: cp.fsdp.compress(small_model()))
    twice = shard(small_model())
    cp.fsdp.compress(twice)
    errors["twice"] = error_of(lambda: cp.fsdp.compress(twice))
    errors["dtype"] = error_of(lambda: cp.fsdp.compress(shard(small_model(torch.float64))))
    errors["feedback"] = error_of(
        lambda: cp.fsdp.compress(shard(small_model()), "int8", "int8", error_feedback=True)
    )
    premul = shard(small_model())
    cp.fsdp.compress(premul)
    for module in premul.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(3.0)  # FSDP2 then asks for PREMUL_SUM(1/3)
    errors["premul"] = error_of(lambda: train(premul, rank, steps=1))
    return errors


def test_misuse_is_a_clear_error_naming_the_argument_or_module():
    errors = run_distributed(_misuse, 2, timeout=120)[0]
    kind, message = errors["unknown codec"]
    assert kind == "ValueError" and message.startswith("all_gather='int9': unknown codec 'int9'")
    assert "reduce_scatter='int8@tree'" in errors["unknown algorithm"][1]
    assert "Sequential has no FSDP modules" in errors["no fsdp"][1]
    assert (
        errors["twice"][0] == "ValueError"
        and "'<root>' is already compressed" in errors["twice"][1]
    )
    assert errors["dtype"][0] == "TypeError" and "module '0'" in errors["dtype"][1]
    assert "needs reduce_scatter='CODEC@alltoall'" in errors["feedback"][1]
    assert "set_force_sum_reduction_for_comms" in errors["premul"][1]


def _several_groups(rank, world_size, on_unsupported):
    model = shard(small_model())

    def refuse(comm):
        raise ValueError("set_custom_all_gather is not supported with multiple param groups")

    model[0].set_custom_all_gather = refuse
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = cp.fsdp.compress(model, on_unsupported=on_unsupported)
    except ValueError as error:
        return str(error)
    return result.left_native, [str(w.message) for w in caught], train(model, rank, steps=1)


def test_a_module_fsdp_refuses_to_customise_is_an_error_or_left_native():
    message = run_distributed(_several_groups, 2, "raise", timeout=120)[0]
    assert message.startswith("module '0': set_custom_all_gather is not supported")
    left, warned, losses = run_distributed(_several_groups, 2, "native", timeout=120)[0]
    assert left == ["0"] and len(losses) == 1
    assert any("module '0' keeps torch's collectives" in message for message in warned)


def test_a_dead_peer_during_training_is_an_error_not_a_hang():
    with pytest.raises(DistributedError, match="rank 0 failed"):
        run_distributed(_dies_mid_training, 2, timeout=120, allow_dead=True)


def _dies_mid_training(rank, world_size):
    from datetime import timedelta

    model = shard(small_model())
    cp.fsdp.compress(model, timeout=timedelta(seconds=10))
    if rank == 1:
        os._exit(1)  # dies without a word, like a crashed host
    train(model, rank, steps=2)
