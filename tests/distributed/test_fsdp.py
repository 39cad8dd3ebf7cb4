"""cp.fsdp.compress against plain FSDP2 and a hand-written data-parallel reference (gloo).

Lossless specs must match plain FSDP bit for bit. Lossy ones are checked step by step:
each all-gather within the codec's error bound of the sharded parameters, each update
within the reduce-scatter's bound of the exact data-parallel update at the gathered
parameters; deliberately broken collectives show that the checks catch wrong gradients.
"""

from __future__ import annotations

import math
import os
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

import commpress as cp
from commpress import _torch_private
from commpress.cluster.local import DistributedError, run_distributed
from commpress.sim import tuner
from commpress.testing import assert_same_bits
from commpress.testing.reference import (
    CORRUPTIONS,
    all_gather_error,
    codec_error,
    from_every_rank,
    reduce_scatter_error,
    sgd_update_ratio,
)

STEPS = 4
LR = 0.05
#: Parameter indices of each FSDP module of small_model (the Linears: weight, bias), in the
#: order of model.parameters(): each module's collectives carry its parameters together.
MODULES = ([0, 1], [2, 3], [4, 5])
INT8, NONE = cp.get_codec("int8"), cp.get_codec("none")


def small_model(dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10)
    ).to(dtype)


def shard(model: nn.Module, policy=None, mesh=None) -> nn.Module:
    policy = policy or MixedPrecisionPolicy()
    mesh = mesh or cp.fsdp.cpu_mesh()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def data(rank: int, step: int, micro: int = 0):
    generator = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    return torch.randn(16, 32, generator=generator), torch.randint(
        0, 10, (16,), generator=generator
    )


def train(model, rank, steps=STEPS, accumulate=1, lr=LR):
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
            for group in _torch_private.fsdp_param_groups(module):
                values += [p.detach().clone() for p in _torch_private.unsharded_parameters(group)]
            module.reshard()
    return values


def full_parameters(model) -> list[torch.Tensor]:
    """The sharded parameters, each all-gathered exactly (torch's own all-gather)."""
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def recorded_training(model, rank, steps=STEPS, lr=LR) -> list[dict]:
    """`train`, recording what the step-by-step checks need: the parameters before and after
    each step, those the all-gathers handed its forward, and every rank's own gradient at
    those (a plain unsharded copy of the model computes it, exactly as FSDP would)."""
    gathered: list[torch.Tensor] = []
    for layer in model:
        if isinstance(layer, nn.Linear):  # runs after FSDP's own pre-forward (the all-gather)
            layer.register_forward_pre_hook(
                lambda module, args: gathered.extend(
                    p.detach().clone() for p in module.parameters(recurse=False)
                )
            )
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    records = []
    for step in range(steps):
        before = full_parameters(model)
        gathered.clear()
        x, y = data(rank, step)
        F.cross_entropy(model(x).float(), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        own = plain_gradients(gathered, x, y)
        records.append(
            {
                "before": before,
                "gathered": list(gathered),
                "contributions": from_every_rank(own),
                "after": full_parameters(model),
            }
        )
    return records


def plain_gradients(parameters: list[torch.Tensor], x, y) -> list[torch.Tensor]:
    """Gradients, in fp32, of a plain small_model holding ``parameters`` (in their dtype)."""
    dtype = parameters[0].dtype
    model = small_model(dtype)
    with torch.no_grad():
        for parameter, value in zip(model.parameters(), parameters, strict=True):
            parameter.copy_(value)
    F.cross_entropy(model(x.to(dtype)).float(), y).backward()
    return [p.grad.float() for p in model.parameters()]


class Corrupted:
    """An FSDP collective (the one ``compress`` installed) run to completion, then
    ``corrupt`` applied to its output: the deliberately broken variants."""

    def __init__(self, inner, corrupt):
        self.inner, self.corrupt = inner, corrupt

    def allocate(self, *args, **kwargs):
        return self.inner.allocate(*args, **kwargs)

    def __call__(self, output_tensor, **kwargs):
        self.inner(output_tensor=output_tensor, **{**kwargs, "async_op": False})
        self.corrupt(output_tensor)


def corrupt_collective(model, which: str, corrupt) -> None:
    for module in model.modules():
        if isinstance(module, FSDPModule):
            _torch_private.wrap_fsdp_collectives(module, which, lambda c: Corrupted(c, corrupt))


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

    def recorded(key, spec, policy=None, broken=None, **kw):
        model = shard(small_model(), policy)
        cp.fsdp.compress(model, *spec, **kw)
        if broken is not None:
            which, corruption = broken
            corrupt_collective(model, which, CORRUPTIONS[corruption])
        records = recorded_training(model, rank)
        results[key] = (records, unsharded_parameters(model))

    run("plain")
    run("none", ("none", "none"))
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    recorded("int8", ("int8", "int8"))
    recorded("int8-alltoall-ef", ("int8", "int8@alltoall"), error_feedback=True)
    recorded("int8-bf16", ("int8", "int8"), policy=bf16)
    recorded("none-recorded", ("none", "none"))
    for corruption in CORRUPTIONS:
        recorded(
            f"reduce_scatter-{corruption}", ("int8", "int8"), broken=("reduce_scatter", corruption)
        )
    recorded("all_gather-negated", ("int8", "int8"), broken=("all_gather", "negated"))
    run("plain-accumulate", accumulate=2)
    run("none-accumulate", ("none", "none"), accumulate=2)
    run("plain-bf16", policy=bf16)
    run("none-bf16", ("none", "none"), policy=bf16)
    run("plain-sum", force_sum=True)
    run("none-sum", ("none", "none"), force_sum=True)
    run("auto-exact", ("auto:max_rel_err=0", "auto:max_rel_err=0@auto"))  # lossless choices
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
        ("auto-exact", "plain"),
    ],
)
def test_uncompressed_specs_match_plain_fsdp_bit_for_bit(scenarios, compressed, plain):
    for rank_results in scenarios:
        losses, params = rank_results[compressed]
        plain_losses, plain_params = rank_results[plain]
        assert losses == plain_losses
        assert same(params, plain_params)


def all_gather_ratio(records, codec, algorithm="ring", world_size=2) -> float:
    """Largest ``|gathered - sharded|`` over its bound, over steps and FSDP modules: at most
    1 when every all-gather is within the codec's error bound of the parameters."""
    worst = 0.0
    for record in records:
        for module in MODULES:
            gathered = [record["gathered"][i] for i in module]
            dtype = gathered[0].dtype  # FSDP casts the shards to param_dtype, then gathers
            sharded = [record["before"][i].to(dtype) for i in module]
            magnitude = max(float(p.abs().max()) for p in sharded)
            bound = all_gather_error(codec, algorithm, magnitude, world_size)
            if dtype != torch.float32 and not codec.lossless:  # decoded in fp32, then rounded
                bound += codec_error(cp.get_codec("bf16"), magnitude + bound)
            deviation = max(
                float((g.float() - p.float()).abs().max())
                for g, p in zip(gathered, sharded, strict=True)
            )
            if bound == 0:  # lossless: bit for bit
                worst = max(worst, math.inf if deviation else 0.0)
            else:
                worst = max(worst, deviation / bound)
    return worst


def update_ratio(records, codec, algorithm="ring", error_feedback=False) -> float:
    """Largest deviation of each step's update from the exact data-parallel update at the
    gathered parameters (lr x the mean of the ranks' own gradients), over its bound: the
    reduce-scatter's error bound for each module, from the codec's (see reference.py)."""
    worst = 0.0
    residuals = {}  # error feedback: per module, each rank's bound on |residual|
    for record in records:
        n = len(record["contributions"])
        for index, module in enumerate(MODULES):
            grads = [[own[i] for i in module] for own in record["contributions"]]
            magnitudes = [max(float(g.abs().max()) for g in own) for own in grads]
            old = residuals.get(index, [0.0] * n) if error_feedback else None
            error = reduce_scatter_error(codec, algorithm, magnitudes, old) / n  # AVG
            if error_feedback:
                residuals[index] = [
                    codec_error(codec, m + r) for m, r in zip(magnitudes, old, strict=True)
                ]
            before = [record["before"][i] for i in module]
            after = [record["after"][i] for i in module]
            worst = max(worst, sgd_update_ratio(before, after, grads, LR, error))
    return worst


@pytest.mark.parametrize(
    ("key", "algorithm", "error_feedback"),
    [
        ("int8", "ring", False),
        ("int8-alltoall-ef", "alltoall", True),
        ("int8-bf16", "ring", False),
    ],
)
def test_each_int8_step_is_the_exact_step_within_the_codec_error_bound(
    scenarios, key, algorithm, error_feedback
):
    """Every step, on every rank: the all-gathers' parameters are within int8's bound of the
    sharded ones, and the update is lr x (the exact mean gradient at those parameters)
    within the reduce-scatter's bound; a zeroed, negated or doubled gradient is far outside
    (see the broken variants below)."""
    for rank_results in scenarios:
        records = rank_results[key][0]
        assert all_gather_ratio(records, NONE) > 1  # really compressed
        assert all_gather_ratio(records, INT8) <= 1
        assert update_ratio(records, INT8, algorithm, error_feedback) <= 1
        assert update_ratio(records, NONE) > 1  # the reduce-scatter really compressed too


def test_the_step_checks_are_exact_for_an_uncompressed_spec(scenarios):
    """The reference is plain data parallelism itself: with ``none``, the gathered parameters
    are the sharded ones bit for bit and the update deviates by fp32 rounding at most."""
    records = scenarios[0]["none-recorded"][0]
    assert all_gather_ratio(records, NONE) == 0
    assert update_ratio(records, NONE) <= 1


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_the_update_check_fails_for_a_broken_reduce_scatter(scenarios, corruption):
    records = scenarios[0][f"reduce_scatter-{corruption}"][0]
    assert all_gather_ratio(records, INT8) <= 1
    assert update_ratio(records, INT8) > 1


def test_the_all_gather_check_fails_for_a_broken_all_gather(scenarios):
    assert all_gather_ratio(scenarios[0]["all_gather-negated"][0], INT8) > 1


@pytest.mark.parametrize("key", ["int8", "int8-bf16", "int8-alltoall-ef"])
def test_every_rank_holds_bitwise_identical_parameters_after_all_gather(scenarios, key):
    for mine, theirs in zip(scenarios[0][key][1], scenarios[1][key][1], strict=True):
        assert_same_bits(mine, theirs)


ALL_GATHER_SPECS = [
    f"{c}@{a}" for c in cp.list_codecs() for a in ("ring", "ring-hop", "backend", "native")
]


def _gather_every_spec(rank, world_size):
    """Per spec, after a training step: the sharded parameters (exact) and the unsharded ones
    the compressed all-gather produces; or the ValueError ``compress`` raised; or, where
    the codec's optional package is not installed (zfpy on a GPU machine), that ImportError."""
    outcomes = {}
    for spec in ALL_GATHER_SPECS:
        model = shard(small_model())
        try:
            cp.fsdp.compress(model, all_gather=spec, reduce_scatter=None)
        except ValueError as error:
            outcomes[spec] = str(error)
            continue
        except ImportError as error:
            if "pip install" not in str(error):  # not a codec's missing optional package
                raise
            outcomes[spec] = error
            continue
        train(model, rank, steps=1)
        outcomes[spec] = (full_parameters(model), unsharded_parameters(model))
    return outcomes


def _outcome(outcomes: dict, spec: str):
    """One spec's outcome; a skip where its codec's optional package is missing."""
    if isinstance(outcomes[spec], ImportError):
        pytest.skip(str(outcomes[spec]))
    return outcomes[spec]


@pytest.fixture(scope="module")
def every_all_gather_spec():
    # World size 3: at 2, ring and ring-hop are the same single hop.
    return run_distributed(_gather_every_spec, 3, timeout=300)


@pytest.mark.parametrize("spec", [s for s in ALL_GATHER_SPECS if s != "zfp@ring-hop"])
def test_every_rank_gathers_bitwise_identical_parameters_within_the_codec_bound(
    every_all_gather_spec, spec
):
    """Every rank ends with the same bits (ring: one encoding forwarded; ring-hop: an
    idempotent codec re-encodes to the same bits), within the codec's bound of the shards."""
    sharded, gathered = _outcome(every_all_gather_spec[0], spec)
    for rank_outcomes in every_all_gather_spec[1:]:
        for mine, theirs in zip(gathered, rank_outcomes[spec][1], strict=True):
            assert_same_bits(theirs, mine, context=spec)
    codec, _, algorithm = spec.partition("@")
    records = [{"before": sharded, "gathered": gathered}]
    assert all_gather_ratio(records, cp.get_codec(codec), algorithm, world_size=3) <= 1


def test_zfp_is_refused_over_ring_hop_where_ranks_would_differ(every_all_gather_spec):
    """zfp is not idempotent: re-encoding at every hop can leave ranks at different
    distances from the owner with different bits (rarely: a few values in 1e5 Gaussian
    ones, none in this small model, so the refusal itself is what is checked)."""
    message = _outcome(every_all_gather_spec[0], "zfp@ring-hop")
    assert isinstance(message, str), "all_gather='zfp@ring-hop' was accepted"
    assert "all_gather='zfp@ring-hop'" in message and "idempotent" in message


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
    errors["float64 sum"] = error_of(  # before: accepted, then refused in the first backward
        lambda: cp.fsdp.compress(shard(small_model(torch.float64)), "none", "none")
    )
    errors["float64 native sum"] = error_of(
        lambda: cp.fsdp.compress(shard(small_model(torch.float64)), "none", "none@native")
    )
    tuned64 = shard(small_model(torch.float64))  # the tuner leaves a float64 sum to torch
    errors["float64 tuned sum"] = error_of(lambda: cp.fsdp.compress(tuned64, "none", "none@auto"))
    plain64 = shard(small_model(torch.float64))

    def step64():
        x, y = data(rank, 0)
        for model in (tuned64, plain64):
            F.cross_entropy(model(x.double()), y).backward()
        for tuned, plain in zip(tuned64.parameters(), plain64.parameters(), strict=True):
            if not torch.equal(tuned.grad.to_local(), plain.grad.to_local()):
                raise AssertionError("float64 gradients differ from plain FSDP's")

    errors["float64 tuned step"] = error_of(step64)
    errors["stochastic all-gather"] = error_of(  # backward's re-gather got other values
        lambda: cp.fsdp.compress(shard(small_model()), "int8:stochastic=true", "int8")
    )
    errors["stochastic tuned all-gather"] = error_of(  # the tuner chose it, and it was used
        lambda: cp.fsdp.compress(shard(small_model()), "auto:codecs=int8:stochastic=true+int8")
    )
    errors["stochastic reduce-scatter"] = error_of(
        lambda: cp.fsdp.compress(shard(small_model()), "int8", "int8:stochastic=true")
    )
    errors["feedback"] = error_of(
        lambda: cp.fsdp.compress(shard(small_model()), "int8", "int8", error_feedback=True)
    )
    errors["budget"] = error_of(  # at compress(), not in the first backward
        lambda: cp.fsdp.compress(shard(small_model()), "int8", "auto:max_rel_err=1e-3,codecs=int8")
    )
    errors["within budget"] = error_of(
        lambda: cp.fsdp.compress(shard(small_model()), "auto", "auto")
    )
    tuner.configure(algorithms=("native", "ring"))  # none that rounds at the owner
    errors["feedback, tuned"] = error_of(
        lambda: cp.fsdp.compress(shard(small_model()), "int8", "int8@auto", error_feedback=True)
    )
    tuner.configure()
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
    assert errors["unknown algorithm"][1].endswith("'auto')")  # the tuner's, taken here too
    assert "Sequential has no FSDP modules" in errors["no fsdp"][1]
    assert (
        errors["twice"][0] == "ValueError"
        and "'<root>' is already compressed" in errors["twice"][1]
    )
    assert errors["dtype"][0] == "TypeError" and "module '0'" in errors["dtype"][1]
    kind, message = errors["float64 sum"]
    assert kind == "TypeError" and "module '0' reduce-scatter dtype=torch.float64" in message
    assert errors["float64 native sum"] is None
    assert errors["float64 tuned sum"] is None and errors["float64 tuned step"] is None
    kind, message = errors["stochastic all-gather"]
    assert kind == "ValueError" and message.startswith("all_gather='int8:stochastic=true': ")
    assert "all-gathers the parameters again for backward" in message
    kind, message = errors["stochastic tuned all-gather"]
    assert kind == "ValueError" and "'auto:codecs=int8:stochastic=true+int8': FSDP2" in message
    assert errors["stochastic reduce-scatter"] is None
    assert "needs reduce_scatter='CODEC@alltoall'" in errors["feedback"][1]
    assert "set_force_sum_reduction_for_comms" in errors["premul"][1]
    assert "asked for PREMUL_SUM(factor " in errors["premul"][1]  # was an object's address
    kind, message = errors["budget"]
    assert kind == "ValueError" and message.startswith("module ")
    assert "reduce-scatter: codec 'auto:max_rel_err=1e-3,codecs=int8': no codec" in message
    assert errors["within budget"] is None
    kind, message = errors["feedback, tuned"]
    assert kind == "ValueError" and "reduce-scatter: error feedback needs one of" in message


def _cast_after_compress(rank, world_size, all_gather, biases_alone=False):
    """Parameters cast to float64 after compress checked their dtypes: FSDP2 then hands
    the collectives float64 (or, the biases alone cast and frozen, raw bytes of both)."""
    model = shard(small_model())
    cp.fsdp.compress(model, all_gather, "int8")
    for name, p in model.named_parameters():
        p.requires_grad_(not (biases_alone and name.endswith("bias")))
    model._apply(lambda t: t.double() if t.dim() == 1 or not biases_alone else t)
    x, y = data(rank, 0)
    try:
        F.cross_entropy(model(x.to(model[0].weight.dtype)).float(), y).backward()
    except TypeError as error:
        return str(error)
    return None


def test_a_dtype_refused_during_a_step_names_the_module_and_the_dtype():
    """The refusal came from the codec deep in the wire-byte count ("codec 'int8' cannot
    take dtype=torch.float64"), naming neither the module nor the collective."""
    message = run_distributed(_cast_after_compress, 2, "int8", timeout=120)[0]
    assert message.startswith("codec 'int8' cannot take module '0' all-gather dtype=")
    assert "float64" in message
    message = run_distributed(_cast_after_compress, 2, "none", timeout=120)[0]
    assert message.startswith("module '4' reduce-scatter dtype=torch.float64: commpress")
    message = run_distributed(_cast_after_compress, 2, "int8", True, timeout=120)[0]
    assert message.startswith("module '0' all-gather dtype: parameters of several dtypes")


def test_a_dtype_a_tuned_spec_refuses_during_a_step_names_the_module():
    """The tuner, timing int8 on float64, raised from the codec's wire-byte count
    ("codec 'int8' cannot take dtype=torch.float64"), naming neither module nor collective."""
    message = run_distributed(_cast_after_compress, 2, "int8@auto", timeout=120)[0]
    assert message.startswith("module '0' all-gather of torch.float64: codec 'int8' cannot")


def _with_a_frozen_float64_parameter(rank, world_size):
    model = small_model()
    model[2].register_parameter("table", nn.Parameter(torch.arange(64.0).double(), False))
    shard(model)
    cp.fsdp.compress(model, all_gather="none", reduce_scatter="int8")
    return train(model, rank, steps=1)


def test_a_frozen_parameter_of_another_dtype_is_not_reduce_scattered_so_not_refused():
    """FSDP2 reduce-scatters only gradients: the frozen float64 parameter was refused as
    a reduce-scatter dtype (which float32 sums cannot hold)."""
    for losses in run_distributed(_with_a_frozen_float64_parameter, 2, timeout=120):
        assert len(losses) == 1 and math.isfinite(losses[0])


def _several_groups(rank, world_size, on_unsupported):
    """The first block seen with two parameter groups (FSDP2 makes them from a
    per-parameter mesh, which needs its private ``shard_placement_fn`` types)."""
    from commpress import _torch_private
    from commpress.integrations.fsdp import MARK

    model = shard(small_model())
    real = _torch_private.fsdp_param_groups
    _torch_private.fsdp_param_groups = lambda m: real(m) * 2 if m is model[0] else real(m)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = cp.fsdp.compress(model, on_unsupported=on_unsupported)
    except ValueError as error:
        return str(error), [n for n, m in model.named_modules() if getattr(m, MARK, False)]
    finally:
        _torch_private.fsdp_param_groups = real
    return result.left_native, [str(w.message) for w in caught], train(model, rank, steps=1)


def test_a_module_fsdp_refuses_to_customise_is_an_error_or_left_native():
    """The refusal comes before anything is installed (it came from FSDP2 half way, the
    modules before it compressed already, and a retry was refused)."""
    message, compressed = run_distributed(_several_groups, 2, "raise", timeout=120)[0]
    assert message.startswith("module '0' has 2 parameter groups") and compressed == []
    left, warned, losses = run_distributed(_several_groups, 2, "native", timeout=120)[0]
    assert left == ["0"] and len(losses) == 1
    assert any("module '0' keeps torch's collectives" in message for message in warned)


def _with_a_custom_all_gather(rank, world_size, on_unsupported, all_gather="int8"):
    """The user's own all-gather on one block, set before compress."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

    class UsersAllGather(DefaultAllGather):
        pass

    model = shard(small_model())
    mine = UsersAllGather()
    model[2].set_custom_all_gather(mine)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = cp.fsdp.compress(model, all_gather, "int8", on_unsupported=on_unsupported)
    except ValueError as error:
        return str(error)
    kept = all(
        group._all_gather_comm is mine for group in model[2]._get_fsdp_state()._fsdp_param_groups
    )
    warned = [str(w.message) for w in caught]
    return result.modules, result.left_native, kept, warned, train(model, rank, steps=1)


def test_a_module_with_its_users_own_collective_is_an_error_or_left_as_it_is():
    """compress replaced the all-gather a user had set with set_custom_all_gather, silently."""
    message = run_distributed(_with_a_custom_all_gather, 2, "raise", timeout=120)[0]
    assert message.startswith("module '2' has its own all-gather (UsersAllGather) set on it")
    assert "on_unsupported='native'" in message
    modules, left, kept, warned, losses = run_distributed(
        _with_a_custom_all_gather, 2, "native", timeout=120
    )[0]
    assert left == ["2"] and "2" not in modules and kept and len(losses) == 1
    assert any("module '2' keeps its collectives as they are" in w for w in warned)
    modules, left, kept, *_ = run_distributed(
        _with_a_custom_all_gather, 2, "raise", None, timeout=120
    )[0]
    assert "2" in modules and left == [] and kept  # all_gather=None keeps it, compressing the rest


def _replicated_only(rank, world_size, on_unsupported):
    """A Linear that FSDP2 replicates without sharding it (a replicate-only
    ``dp_mesh_dims``; its parameters must then be DTensors on the mesh, as its input)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import DataParallelMeshDims
    from torch.distributed.tensor import Replicate, distribute_tensor

    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu", mesh_dim_names=("dp",))
    for name, p in list(model.named_parameters()):
        setattr(model, name, nn.Parameter(distribute_tensor(p.detach(), mesh, [Replicate()])))
    fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(replicate="dp"))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = cp.fsdp.compress(model, on_unsupported=on_unsupported)
    except ValueError as error:
        return str(error)
    x = distribute_tensor(torch.randn(2, 8, generator=torch.Generator().manual_seed(rank)), mesh,
                          [Replicate()])  # fmt: skip
    model(x).sum().backward()
    return result.left_native, result.modules, [str(w.message) for w in caught]


def test_a_module_fsdp_replicates_without_sharding_is_an_error_or_left_native():
    """FSDP2 all-reduces such a module's gradients; compress failed reading its shard
    group, with a PrivateAPIMissing that blamed the torch version."""
    message = run_distributed(_replicated_only, 2, "raise", timeout=60)[0]
    assert message.startswith("module '<root>' is replicated, not sharded")
    assert "on_unsupported='native'" in message
    left, compressed, warned = run_distributed(_replicated_only, 2, "native", timeout=60)[0]
    assert left == ["<root>"] and compressed == []
    assert any("'<root>' keeps torch's collectives: it is replicated" in w for w in warned)


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


class _TwoBranches(nn.Module):
    """One FSDP module whose step runs one of two same-shape layers: ``q``'s gradient is
    exactly zero where it runs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.p = nn.Linear(16, 16, bias=False)
        self.q = nn.Linear(16, 16, bias=False)

    def forward(self, x, branch):
        return self.p(x) if branch == "p" else self.q(x) * 0.0


def _residual_across_parameter_sets(rank, world_size):
    model = _TwoBranches()
    fully_shard(model, mesh=cp.fsdp.cpu_mesh())
    cp.fsdp.compress(model, "none", "int8@alltoall", error_feedback=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    generator = torch.Generator().manual_seed(rank)
    for branch in ("p", "q"):
        before = model.q.weight.full_tensor().clone()
        model(torch.randn(8, 16, generator=generator), branch).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return torch.equal(model.q.weight.full_tensor(), before)


def test_error_feedback_keeps_a_residual_to_the_parameters_it_came_from():
    """A step reduces only the parameters with a gradient: p's residual (p alone reduced)
    was added to q's zero gradient the step after (q alone, the same size), and q moved."""
    assert run_distributed(_residual_across_parameter_sets, 2, timeout=60) == [True, True]


def _residual_with_unused_parameters_reduce_scattered(rank, world_size):
    model = _TwoBranches()
    fully_shard(model, mesh=cp.fsdp.cpu_mesh())
    model.set_reduce_scatter_unused_params(True)
    compression = cp.fsdp.compress(model, "none", "int8@alltoall", error_feedback=True)
    generator = torch.Generator().manual_seed(rank)
    model(torch.randn(8, 16, generator=generator), "pq"[rank]).square().sum().backward()
    state = compression.state_dict()
    compression.load_state_dict(state)
    return state["of_rank"][str(rank)][0]["residuals"]["<root>"]["parameters_with_gradients"]


def test_error_feedback_counts_the_zero_gradients_fsdp_reduce_scatters_for_unused_parameters():
    """set_reduce_scatter_unused_params(True): FSDP2 reduce-scatters a zero gradient for a
    parameter without one (each rank ran another branch). The residual was recorded as of
    the used parameter alone, and loading the compression's own state_dict raised a
    ValueError (a residual of 512 elements for one parameter's 256)."""
    outcomes = run_distributed(_residual_with_unused_parameters_reduce_scattered, 2, timeout=60)
    assert outcomes == [[True, True], [True, True]]


def _steps_reset(rank, world_size):
    """Residuals after FSDP2's recovery (reset_iter_state) from a backward that raises once
    module '4' has reduce-scattered, before '2' and '0'; and from a forward that raises
    after a successful backward of the same step (gradient accumulation: the microbatch
    sequence is invalidated, its first backward's gradients discarded too)."""
    model = shard(small_model())
    compression = cp.fsdp.compress(model, "int8", "int8@alltoall", error_feedback=True)

    def fail(grad):
        raise RuntimeError("aborted mid-backward")

    def fail_in_backward(module, args, output) -> None:
        output.register_hook(fail)

    def abort_forward(module, args):
        raise RuntimeError("aborted mid-forward")

    def step(microbatch=0):
        x, y = data(rank, microbatch)
        F.cross_entropy(model(x), y).backward()

    def aborted(where, hook, error):
        handle = hook(where)
        with pytest.raises(RuntimeError, match=error):
            step(1)
        handle.remove()
        model.reset_iter_state()
        model.zero_grad()

    def residuals():
        found = compression.state_dict()["of_rank"][str(rank)][0]["residuals"]
        return {name: found[name]["residual"] for name in ("0", "2", "4")}

    step()
    fed = residuals()
    aborted(model[3], lambda m: m.register_forward_hook(fail_in_backward), "mid-backward")
    after_backward = residuals()
    step()
    retried = residuals()
    step()  # a first microbatch, then the second aborts in its forward
    aborted(model[2], lambda m: m.register_forward_pre_hook(abort_forward), "mid-forward")
    return fed, after_backward, retried, residuals()


def test_reset_iter_state_leaves_no_residual_of_discarded_gradients():
    """reset_iter_state discards the gradients in flight: module '4' kept the residual of
    its reduce-scatter (the rounding error of gradients no optimizer saw; the residual
    before it was sent with them), and the step run again added it; under gradient
    accumulation every module kept the residual of the sequence's first backward. Every
    residual restarts from zero, and the next step feeds them again."""
    for fed, after_backward, retried, after_forward in run_distributed(
        _steps_reset, 2, timeout=120
    ):
        assert all(residual is not None for residual in fed.values())
        assert all(residual is None for residual in after_backward.values())
        assert all(residual is not None for residual in retried.values())
        assert all(residual is None for residual in after_forward.values())


def _same_gradient_every_step(rank, world_size):
    """The reduce-scattered gradient of one unchanging gradient, step after step (no
    optimizer step), and the exact mean gradient over ranks."""
    torch.manual_seed(0)
    model = nn.Linear(64, 32, bias=False)
    fully_shard(model, mesh=cp.fsdp.cpu_mesh())
    cp.fsdp.compress(model, "none", "int8@alltoall", error_feedback=True)
    generators = [torch.Generator().manual_seed(r) for r in range(world_size)]
    inputs = [
        (torch.randn(8, 64, generator=g), torch.randn(8, 32, generator=g)) for g in generators
    ]
    exact = sum(weights.T @ x for x, weights in inputs) / world_size
    x, weights = inputs[rank]
    reduced = []
    for _ in range(8):
        (model(x) * weights).sum().backward()
        reduced.append(model.weight.grad.full_tensor().clone())
        model.zero_grad()
    return reduced, exact


def test_error_feedback_carries_the_residual_from_step_to_step():
    """With error feedback, what one step's encoding lost is sent the next step: the mean of
    the gradients of 8 steps of one unchanging gradient is within one residual / 8 of the
    exact one, where each step alone is off by its rounding error. A residual started from
    zero at every call (no feedback at all) passed every other test of the adapter."""
    for reduced, exact in run_distributed(_same_gradient_every_step, 2, timeout=60):
        one_step = (reduced[0] - exact).norm()
        assert one_step > 0  # int8 rounds this gradient
        assert (torch.stack(reduced).mean(dim=0) - exact).norm() < one_step / 3


def _momentum_steps(model, optimizer, rank, steps: range) -> None:
    for step in steps:
        x, y = data(rank, step)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


def _compressed_with_momentum():
    model = shard(small_model())
    cp.fsdp.compress(model, all_gather="int8", reduce_scatter="int8")
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def _run_and_checkpoint(rank, world_size, directory):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizer = _compressed_with_momentum()
    _momentum_steps(model, optimizer, rank, range(2))
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=directory)
    _momentum_steps(model, optimizer, rank, range(2, 4))
    return full_parameters(model)


def _resumed(rank, world_size, directory):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, optimizer = _compressed_with_momentum()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    saved = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(saved, checkpoint_id=directory)
    set_state_dict(
        model, optimizer, model_state_dict=saved["model"], optim_state_dict=saved["optimizer"]
    )
    _momentum_steps(model, optimizer, rank, range(2, 4))
    return full_parameters(model)


def test_a_run_resumed_from_a_dcp_checkpoint_in_new_processes_is_the_uninterrupted_run(tmp_path):
    """docs/fsdp-ddp.md's promise for round-to-nearest codecs: commpress keeps no state a resumed
    FSDP2 run needs beyond the model's and optimizer's, and adds nothing to them."""
    directory = str(tmp_path / "checkpoint")
    uninterrupted = run_distributed(_run_and_checkpoint, 2, directory, timeout=120)[0]
    resumed = run_distributed(_resumed, 2, directory, timeout=120)[0]
    assert same(uninterrupted, resumed)


STOCHASTIC = "int8:stochastic=true"
FEEDBACK = "int8@alltoall"


def _feedback_with_momentum(error_feedback=True):
    model = shard(small_model())
    compression = cp.fsdp.compress(
        model, all_gather="int8", reduce_scatter=FEEDBACK, error_feedback=error_feedback
    )
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), compression


def _stochastic():
    model = shard(small_model())
    cp.fsdp.compress(model, all_gather="int8", reduce_scatter=STOCHASTIC)
    codec = cp.get_codec(STOCHASTIC)
    return model, codec.rounding_state, codec.load_rounding_state


def _feedback():
    model, _, compression = _feedback_with_momentum()
    return model, compression.state_dict, compression.load_state_dict


#: State beyond the model's and the optimizer's that shapes the bits of the next step:
#: its compressed model, and how that state is saved and loaded.
EXTRA_STATE = {"rounding": _stochastic, "residuals": _feedback}


def _extra_state_file(directory, kind, rank) -> str:
    return os.path.join(directory, f"{kind}-{rank}.pt")


def _run_and_checkpoint_with(rank, world_size, directory, kind):
    model, save_extra, _ = EXTRA_STATE[kind]()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    _momentum_steps(model, optimizer, rank, range(2))
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
        os.path.join(directory, f"training-{rank}.pt"),
    )
    torch.save(save_extra(), _extra_state_file(directory, kind, rank))
    _momentum_steps(model, optimizer, rank, range(2, 3))
    return full_parameters(model)


def _resumed_with(rank, world_size, directory, kind, restore_extra):
    model, _, load_extra = EXTRA_STATE[kind]()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    saved = torch.load(os.path.join(directory, f"training-{rank}.pt"), weights_only=False)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    peers = torch.load(_extra_state_file(directory, kind, 1 - rank), weights_only=True)
    with pytest.raises(ValueError, match=f"state was saved by rank {1 - rank}, this is rank"):
        load_extra(peers)
    if restore_extra:
        load_extra(torch.load(_extra_state_file(directory, kind, rank), weights_only=True))
    _momentum_steps(model, optimizer, rank, range(2, 3))
    return full_parameters(model)


@pytest.fixture(scope="module", params=list(EXTRA_STATE))
def extra_checkpoint(tmp_path_factory, request):
    directory = str(tmp_path_factory.mktemp(request.param))
    uninterrupted = run_distributed(
        _run_and_checkpoint_with, 2, directory, request.param, timeout=120
    )
    return directory, request.param, uninterrupted[0]


@pytest.mark.parametrize("restore_extra", [True, False], ids=["restored", "not_restored"])
def test_a_run_resumed_with_its_extra_state_is_the_uninterrupted_run(
    extra_checkpoint, restore_extra
):
    """Stochastic rounding's noise streams (``codec.rounding_state()``) and error feedback's
    residuals with the parameters each came from (``compression.state_dict()``) are state
    beyond the model's and the optimizer's: restored from each rank's own file, the step
    after the checkpoint is the uninterrupted run's; not restored, the first steps' noise
    is replayed, or the residuals restart from zero."""
    directory, kind, uninterrupted = extra_checkpoint
    resumed = run_distributed(_resumed_with, 2, directory, kind, restore_extra, timeout=120)
    assert same(uninterrupted, resumed[0]) == restore_extra


def _residual_state_refusals(rank, world_size):
    model, optimizer, compression = _feedback_with_momentum()
    _momentum_steps(model, optimizer, rank, range(1))
    whole = compression.state_dict()
    state = _own(whole, rank)
    errors = {}

    def error_of(bad_state, into=compression, of_rank=rank):
        try:
            into.load_state_dict({"of_rank": {str(of_rank): (bad_state,)}})
        except (ValueError, TypeError) as error:
            return type(error).__name__, str(error)
        return None

    def error_of_whole(bad_whole):
        try:
            compression.load_state_dict(bad_whole)
        except (ValueError, TypeError) as error:
            return type(error).__name__, str(error)
        return None

    errors["not a dict"] = error_of_whole([whole])
    errors["model's"] = error_of_whole(model.state_dict())
    errors["not a tuple"] = error_of_whole({"of_rank": {str(rank): state}})
    errors["world size"] = error_of({**state, "world_size": 3})
    errors["rank"] = error_of(state, of_rank=1 - rank)
    errors["rank inside"] = error_of({**state, "rank": 1 - rank})
    errors["without feedback"] = error_of(
        _own(_feedback_with_momentum(False)[2].state_dict(), rank)
    )
    errors["into no feedback"] = error_of(state, into=_feedback_with_momentum(False)[2])
    residuals = state["residuals"]
    fewer = {name: saved for name, saved in residuals.items() if name != "2"}
    errors["missing module"] = error_of({**state, "residuals": fewer})
    errors["extra module"] = error_of({**state, "residuals": {**residuals, "9": residuals["2"]}})
    longer = {**residuals["2"], "residual": torch.zeros(residuals["2"]["residual"].numel() + 2)}
    errors["shape"] = error_of({**state, "residuals": {**residuals, "2": longer}})
    wrong_count = {**residuals["2"], "parameters_with_gradients": [True]}
    errors["parameter count"] = error_of({**state, "residuals": {**residuals, "2": wrong_count}})
    errors["after refusals"] = [
        torch.equal(saved["residual"], now["residual"])
        for saved, now in zip(
            residuals.values(),
            _own(compression.state_dict(), rank)["residuals"].values(),
            strict=True,
        )
        if saved["residual"] is not None
    ]
    return errors


def _own(whole: dict, rank: int) -> dict:
    ((own,),) = [whole["of_rank"][str(rank)]]
    return own


def _residuals_through_dcp(rank, world_size, directory):
    import torch.distributed.checkpoint as dcp

    model, optimizer, compression = _feedback_with_momentum()
    _momentum_steps(model, optimizer, rank, range(1))
    dcp.save({"compression": compression}, checkpoint_id=directory)
    fresh = _feedback_with_momentum()[2]  # no residual yet: the template holds none
    dcp.load({"compression": fresh}, checkpoint_id=directory)
    saved, loaded = (_own(c.state_dict(), rank)["residuals"]["2"] for c in (compression, fresh))
    assert saved["parameters_with_gradients"] == loaded["parameters_with_gradients"]
    return saved["residual"], loaded["residual"]


def test_residuals_saved_through_dcp_load_on_each_rank_its_own(tmp_path):
    """A Compression is a checkpoint's Stateful: DCP kept one copy of what every rank held
    under one key (another rank's residual under this rank's number), and a fresh
    compression's template had no tensor to load into."""
    outcomes = run_distributed(_residuals_through_dcp, 2, str(tmp_path / "dcp"), timeout=120)
    for saved, loaded in outcomes:
        assert torch.equal(saved, loaded)
    assert not torch.equal(outcomes[0][0], outcomes[1][0])  # the ranks' residuals differ


#: Per refusal of ``_residual_state_refusals``: the error's type and the start of its words.
RESIDUAL_STATE_REFUSALS = {
    "not a dict": ("TypeError", "state must be the dict of Compression.state_dict(), got list"),
    "model's": ("ValueError", "state is not a Compression.state_dict()"),
    "not a tuple": ("ValueError", "state['of_rank']['0'] must be a tuple of one dict"),
    "world size": ("ValueError", "state was saved by a rank of 3 processes"),
    "rank": ("ValueError", "state was saved by rank 1, this is rank 0"),
    "rank inside": ("ValueError", "state was saved by rank 1, this is rank 0"),
    "without feedback": ("ValueError", "state was saved without error feedback"),
    "into no feedback": ("ValueError", "state holds error-feedback residuals, and this"),
    "missing module": ("ValueError", "state has no residual of modules ['2']"),
    "extra module": ("ValueError", "state has residuals of modules ['9']"),
    "shape": ("ValueError", "state['residuals']['2']['residual'] has"),
    "parameter count": ("ValueError", "state['residuals']['2']['parameters_with_gradients']"),
}


def test_a_residual_state_of_another_rank_world_model_or_setting_is_refused_naming_state():
    errors = run_distributed(_residual_state_refusals, 2, timeout=120)[0]
    for case, (kind, words) in RESIDUAL_STATE_REFUSALS.items():
        assert errors[case] is not None, case
        assert errors[case][0] == kind and errors[case][1].startswith(words), (case, errors[case])
    assert errors["after refusals"] and all(errors["after refusals"])


def _state_dicts_while_unsharded(rank, world_size):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    exact = small_model().state_dict()
    model = shard(small_model())
    cp.fsdp.compress(model, all_gather="int4", reduce_scatter="int8")
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.unshard()
    gathered = model[0].weight.detach().clone()
    local = {name: value.full_tensor() for name, value in model.state_dict().items()}
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return (
        torch.equal(gathered, exact["0.weight"]),
        all(torch.equal(local[name], value) for name, value in exact.items()),
        all(torch.equal(full[name], value) for name, value in exact.items()),
    )


def test_state_dicts_hold_the_exact_weights_while_unshard_holds_the_codecs():
    """docs/fsdp-ddp.md's promise: a compressed all-gather never reaches a state dict, full or
    sharded, even while the modules are unsharded, whose parameters are the codec's."""
    for unsharded_exact, local_exact, full_exact in run_distributed(
        _state_dicts_while_unsharded, 2, timeout=60
    ):
        assert not unsharded_exact
        assert local_exact and full_exact


def _saved_weights_forward_and_backward(rank, world_size):
    """How far each weight backward read (a tensor autograd saved in forward, all-gathered
    again for backward on the post-forward group of ``reshard_after_forward=2``) is from
    what forward read; and the sizes of the groups the all-gathers ran on."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 40), nn.GELU(), nn.Linear(40, 24), nn.GELU())
    mesh = cp.fsdp.cpu_mesh()
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=2)
    cp.fsdp.compress(model, "int8", None)
    sizes = set()

    def recording(collective):
        def call(output_tensor, input_tensor, group, async_op=False):
            sizes.add(group.size())
            return collective(output_tensor, input_tensor, group, async_op)

        call.allocate = collective.allocate
        return call

    for layer in (model[0], model[2]):
        _torch_private.wrap_fsdp_collectives(layer, "all_gather", recording)
    weights = {(40, 48), (24, 40)}
    distances = []

    def pack(tensor):
        is_weight = tuple(tensor.t().shape) in weights if tensor.dim() == 2 else False
        return tensor, tensor.detach().clone() if is_weight else None

    def unpack(saved):
        tensor, forward = saved
        if forward is not None:
            distances.append((tensor - forward).abs().max().item())
        return tensor

    x = torch.randn(8, 48, generator=torch.Generator().manual_seed(rank))
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = model(x).square().mean()
    loss.backward()
    return distances, sizes


def test_backward_sees_the_weights_forward_saw_after_resharding_to_a_smaller_group():
    """reshard_after_forward=2 on 4 ranks: FSDP2 keeps a 2-rank shard of the decoded
    parameters after forward and all-gathers them on that smaller group for backward. int8
    re-encoded them there, on other blocks, and backward computed its gradients with
    weights up to 5e-4 from forward's; they are now sent as they are."""
    for distances, sizes in run_distributed(_saved_weights_forward_and_backward, 4, timeout=120):
        assert sizes == {4, 2}  # forward's all-gathers, then backward's on the smaller group
        assert distances and all(distance == 0 for distance in distances), distances


# FSDP2 features combined with compress. Each feature below leaves the arithmetic of a step
# as it was, except the unused layer: with "none" it is plain FSDP2's bits, and with int8 it
# is the baseline's int8 bits (whose steps the tests above check against the codec's bound).


class _Recomputed(nn.Module):
    """``layer`` under activation checkpointing: backward runs it again (a Linear and its
    GELU, whose saved input then comes from the weights gathered again for backward)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return checkpoint(self.layer, x, use_reentrant=False)


class _Layers(nn.Sequential):
    """small_model's layers; ``logits`` is forward by another name (for
    register_fsdp_forward_method); ``skip_middle`` leaves the middle Linear unused."""

    skip_middle = False

    def forward(self, x):
        for index, layer in enumerate(self):
            if not (self.skip_middle and index in (2, 3)):
                x = layer(x)
        return x

    def logits(self, x):
        return self.forward(x)


BF16_FP32 = {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32}
#: each feature, and the one whose int8 bits it must give
SAME_INT8_BITS_AS = {
    "recompute": "baseline",
    "checkpoint_wrapper": "baseline",
    "cpu_offload": "baseline",
    "sharded_in_reverse": "baseline",
    "unshard_by_hand": "baseline",
    "unshard_async_by_hand": "baseline",
    "forward_method": "baseline",
    "bf16_output_fp32": "bf16",
    "bf16_inputs_cast_by_hand": "bf16",
}
FEATURES = ["baseline", "bf16", "unused_layer", *SAME_INT8_BITS_AS]


def _featured(feature: str) -> _Layers:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import CPUOffloadPolicy, register_fsdp_forward_method

    model = _Layers(*small_model())
    blocks = [0, 2, 4]
    wrap = {"recompute": _Recomputed, "checkpoint_wrapper": checkpoint_wrapper}.get(feature)
    for index in blocks if wrap else []:
        if index + 1 < len(model):
            model[index], model[index + 1] = (
                nn.Sequential(model[index], model[index + 1]),
                nn.Identity(),
            )
        model[index] = wrap(model[index])
    mesh, options = cp.fsdp.cpu_mesh(), {}
    if feature == "cpu_offload":
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    if feature.startswith("bf16"):
        cast = feature != "bf16_inputs_cast_by_hand"
        options["mp_policy"] = MixedPrecisionPolicy(**BF16_FP32, cast_forward_inputs=cast)
    for index in reversed(blocks) if feature == "sharded_in_reverse" else blocks:
        fully_shard(model[index], mesh=mesh, **options)
    if feature == "bf16_output_fp32":
        options["mp_policy"] = MixedPrecisionPolicy(**BF16_FP32, output_dtype=torch.float32)
    fully_shard(model, mesh=mesh, **options)
    if feature == "forward_method":
        register_fsdp_forward_method(model, "logits")
    return model


def _feature_steps(model: _Layers, feature: str, rank: int, steps: int = 3):
    fsdp_modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, y = data(rank, step)
        if feature == "bf16_inputs_cast_by_hand":
            x = x.bfloat16()
        model.skip_middle = feature == "unused_layer" and step % 2 == 1
        if feature.startswith("unshard"):
            handles = [m.unshard(async_op="async" in feature) for m in fsdp_modules]
            for handle in filter(None, handles):
                handle.wait()
        output = model.logits(x) if feature == "forward_method" else model(x)
        if feature == "bf16_output_fp32":
            assert output.dtype == torch.float32
        loss = F.cross_entropy(output.float(), y)
        loss.backward()
        if feature.startswith("unshard"):
            for module in fsdp_modules:
                module.reshard()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, full_parameters(model)


def _features(rank, world_size):
    results = {}
    for feature in FEATURES:
        for spec in (None, "none", "int8"):
            model = _featured(feature)
            if spec is not None:
                cp.fsdp.compress(model, spec, spec)
            results[feature, spec] = _feature_steps(model, feature, rank)
    return results


@pytest.fixture(scope="module")
def features():
    return run_distributed(_features, 2, timeout=300)


@pytest.mark.parametrize("feature", FEATURES)
def test_fsdp_features_with_none_are_plain_fsdp_bit_for_bit(features, feature):
    for rank_results in features:
        losses, params = rank_results[feature, "none"]
        plain_losses, plain_params = rank_results[feature, None]
        assert losses == plain_losses
        assert same(params, plain_params)


@pytest.mark.parametrize("feature", FEATURES)
def test_fsdp_features_with_int8_leave_every_rank_the_same_compressed_parameters(features, feature):
    first, *others = [rank_results[feature, "int8"][1] for rank_results in features]
    assert all(same(first, params) for params in others)
    assert not same(first, features[0][feature, None][1])  # really compressed


@pytest.mark.parametrize("feature", list(SAME_INT8_BITS_AS))
def test_fsdp_features_that_keep_the_arithmetic_give_the_baselines_int8_bits(features, feature):
    """Recomputed activations see forward's decoded parameters (a re-gather of the same
    shards decodes to the same bits), a hand-made unshard all-gathers as forward does."""
    baseline = SAME_INT8_BITS_AS[feature]
    for rank_results in features:
        losses, params = rank_results[feature, "int8"]
        baseline_losses, baseline_params = rank_results[baseline, "int8"]
        assert losses == baseline_losses
        assert same(params, baseline_params)


def _hybrid_sharded(rank, world_size):
    """HSDP on 4 ranks: shard over 2, replicate over 2 (FSDP2 all-reduces the
    reduce-scattered gradients across the replicas with torch's all-reduce)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    results = {}
    for spec in (None, "none"):
        model = shard(small_model(), mesh=mesh)
        if spec is not None:
            cp.fsdp.compress(model, spec, spec)
        results[spec] = (train(model, rank), full_parameters(model))
    model = shard(small_model(), mesh=mesh)
    cp.fsdp.compress(model, "int8", "int8")
    records = recorded_training(model, rank)
    local = [p.to_local().detach().clone() for p in model.parameters()]
    results["int8"] = (records, full_parameters(model), local)
    return results


def test_hybrid_sharding_is_plain_fsdp_with_none_and_within_the_int8_bound():
    """Each int8 step within the bound of a reduce-scatter over all 4 ranks, looser than
    the two 2-rank ones HSDP runs (whose sums torch's all-reduce then adds); the replicas of
    a shard hold the same bits."""
    outcomes = run_distributed(_hybrid_sharded, 4, timeout=120)
    for rank_results in outcomes:
        assert rank_results["none"][0] == rank_results[None][0]
        assert same(rank_results["none"][1], rank_results[None][1])
        records = rank_results["int8"][0]
        assert all_gather_ratio(records, INT8, world_size=2) <= 1
        assert update_ratio(records, INT8) <= 1
        assert update_ratio(records, NONE) > 1
    full = [rank_results["int8"][1] for rank_results in outcomes]
    assert all(same(full[0], params) for params in full[1:])
    local = [rank_results["int8"][2] for rank_results in outcomes]
    assert same(local[0], local[2]) and same(local[1], local[3])  # replicas: ranks 0, 2; 1, 3


def _with_modules_kept(rank, world_size, keep):
    """The first and last layers kept with FSDP2's own collectives (``keep`` may differ by
    rank: a list of lists)."""
    if keep and isinstance(keep[0], list):
        keep = keep[rank]
    model = shard(small_model())
    try:
        result = cp.fsdp.compress(model, "int8", "int8", keep=keep)
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    replaced = {
        name: _torch_private.replaced_collective(module, "all_gather") is not None
        for name, module in [("0", model[0]), ("2", model[2]), ("4", model[4])]
    }
    return result.modules, result.left_native, replaced, train(model, rank, steps=2)


def test_modules_kept_keep_fsdps_own_collectives_and_the_others_are_compressed():
    """A user wanting an embedding or an output layer gathered at full precision had no
    way to keep one module out of compress."""
    results = run_distributed(_with_modules_kept, 2, ["0", "4"], timeout=120)
    for modules, left, replaced, losses in results:
        assert sorted(left) == ["0", "4"] and "0" not in modules and "2" in modules
        assert replaced == {"0": False, "2": True, "4": False}
        assert all(math.isfinite(loss) for loss in losses)


def _feedback_kept(keep):
    model = shard(small_model())
    compression = cp.fsdp.compress(model, "int8", FEEDBACK, error_feedback=True, keep=keep)
    return model, compression


def _residuals_loaded_with_another_keep(rank, world_size):
    model, compression = _feedback_kept(["0"])
    x, y = data(rank, 0)
    F.cross_entropy(model(x), y).backward()
    state = compression.state_dict()
    refused = {}
    for keep in (["2"], ["0", "2"]):
        try:
            _feedback_kept(keep)[1].load_state_dict(state)
        except ValueError as error:
            refused[str(keep)] = str(error)
    return refused


def test_residuals_loaded_into_a_compression_with_another_keep_say_that_keep_differs():
    """Residuals saved with keep=['0'], loaded with another keep, were refused as "a state of
    another model", of the same model."""
    refused = run_distributed(_residuals_loaded_with_another_keep, 2, timeout=120)[0]
    assert refused["['2']"].startswith(
        "state has no residual of modules ['0'], which the compression that saved it left "
        "native: keep differs (saved with modules ['0'] left native, this compression "
        "modules ['2'] left native"
    ), refused
    assert refused["['0', '2']"].startswith(
        "state has residuals of modules ['2'], which this compression leaves native: keep "
        "differs (saved with modules ['0'] left native, this compression modules ['0', '2']"
    ), refused


def test_keep_names_only_fsdp_modules_and_the_same_on_every_rank():
    unknown = run_distributed(_with_modules_kept, 2, ["0", "1", "nope"], timeout=60)[0]
    assert unknown.startswith("ValueError: keep names '1', 'nope': not FSDP modules of the model")
    assert "'<root>', '0', '2', '4'" in unknown
    for keep in ("0", [0]):
        assert run_distributed(_with_modules_kept, 2, keep, timeout=60)[0].startswith(
            "TypeError: keep must be a list of module names"
        )
    every = run_distributed(_with_modules_kept, 2, ["<root>", "0", "2", "4"], timeout=60)[0]
    assert every == "ValueError: keep names every FSDP module of the model: nothing to compress"
    differing = run_distributed(_with_modules_kept, 2, [["0"], ["4"]], timeout=60)
    for message in differing:
        assert "keeps other modules on other ranks: rank 0: keep=['0']; rank 1: keep=['4']" in (
            message
        )


def _kept_of_one_unit(rank, world_size, keep):
    """Layers 0 and 2 made one FSDP unit (``fully_shard([model[0], model[2]])``, as
    torchtitan shards its final norm with its output layer), ``keep`` given to compress."""
    model, mesh = small_model(), cp.fsdp.cpu_mesh()
    fully_shard([model[0], model[2]], mesh=mesh)
    fully_shard(model[4], mesh=mesh)
    fully_shard(model, mesh=mesh)
    try:
        result = cp.fsdp.compress(model, "int8", "int8", keep=keep)
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    replaced = {
        name: _torch_private.replaced_collective(model[int(name)], "all_gather") is not None
        for name in ("0", "2", "4")
    }
    return result.left_native, replaced


def test_keep_takes_the_modules_of_one_fully_shard_call_together():
    """keep=['2'], where fully_shard([model[0], model[2]]) made the two one FSDP unit (one
    parameter group, one set of collectives), listed '2' in left_native while compressing
    it through '0' (and keep=['0'] compressed '0' through '2'), silently."""
    for keep in (["0"], ["2"]):
        for message in run_distributed(_kept_of_one_unit, 2, keep, timeout=60):
            assert message.startswith("ValueError: keep names "), message
            assert "'0'" in message and "'2'" in message and "one FSDP unit" in message
    for left, replaced in run_distributed(_kept_of_one_unit, 2, ["0", "2"], timeout=60):
        assert sorted(left) == ["0", "2"]
        assert replaced == {"0": False, "2": False, "4": True}


def _two_compressions(rank, world_size):
    model = shard(small_model())
    cp.fsdp.compress(model, "int8", "int8", keep=["0", "4"])
    cp.fsdp.compress(model, "none", "int4@ring", keep=["<root>", "2"])
    specs = {
        name: (
            _torch_private.replaced_collective(model[int(name)], "all_gather").spec.text,
            _torch_private.replaced_collective(model[int(name)], "reduce_scatter").spec.text,
        )
        for name in ("0", "2", "4")
    }
    try:
        cp.fsdp.compress(model, "int8", "int8", keep=["<root>", "2", "4"])
    except ValueError as error:
        twice = str(error)
    return specs, train(model, rank, steps=1), twice


def test_modules_kept_by_one_compress_take_another_codec_from_a_second():
    specs, losses, twice = run_distributed(_two_compressions, 2, timeout=120)[0]
    assert specs == {
        "0": ("none", "int4@ring"),
        "2": ("int8", "int8"),
        "4": ("none", "int4@ring"),
    }
    assert math.isfinite(losses[0])
    assert twice.startswith("module '0' is already compressed: a module takes one compress")
