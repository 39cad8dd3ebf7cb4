"""Every private torch API commpress uses exists, and a missing one is a loud, named error."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import commpress as cp
from commpress import _torch_private
from commpress._torch_private import PRIVATE_APIS, PrivateAPIMissing
from commpress.cluster.local import run_distributed


@pytest.mark.parametrize("api", sorted(PRIVATE_APIS))
def test_each_private_api_exists_in_the_installed_torch(api):
    assert PRIVATE_APIS[api]() is not None


def test_a_missing_private_api_names_itself_and_the_torch_version(monkeypatch):
    monkeypatch.delattr(torch.cuda, "_sleep")
    with pytest.raises(PrivateAPIMissing, match=r"torch\.cuda\._sleep") as caught:
        _torch_private.cuda_sleep(1)
    assert torch.__version__ in str(caught.value)
    assert isinstance(caught.value, RuntimeError)


def test_a_renamed_compile_wrapper_fails_only_for_a_compiled_model(monkeypatch):
    """A plain module never asks for torch.compile's wrapper class, so a torch that renamed
    it still serves plain models; a compiled one gets the loud error."""
    import torch._dynamo.eval_frame as eval_frame

    compiled, plain = torch.compile(nn.Linear(2, 2)), nn.Linear(2, 2)
    assert _torch_private.compiled_original(compiled) is compiled._orig_mod
    monkeypatch.delattr(eval_frame, "OptimizedModule")
    assert _torch_private.compiled_original(plain) is None
    with pytest.raises(PrivateAPIMissing, match="OptimizedModule"):
        _torch_private.compiled_original(compiled)


def test_a_missing_private_module_names_itself(monkeypatch):
    monkeypatch.setattr(_torch_private, "FSDP_API_MODULE", "torch.no_such_module")
    with pytest.raises(PrivateAPIMissing, match=r"torch\.no_such_module"):
        _torch_private.fsdp_comm_classes()


def _fsdp_state(rank, world_size):
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 3))
    for layer in model:
        fully_shard(layer, mesh=cp.fsdp.cpu_mesh())
    fully_shard(model, mesh=cp.fsdp.cpu_mesh())
    seen = []
    for which in ("all_gather", "reduce_scatter"):
        _torch_private.wrap_fsdp_collectives(model[0], which, lambda c: seen.append(c) or c)
    found = [len(seen)]
    for module in (model, model[0]):
        for group in _torch_private.fsdp_param_groups(module):
            module.unshard()
            found.append(
                (
                    [tuple(s.to_local().shape) for s in group.sharded],
                    [tuple(p.shape) for p in _torch_private.unsharded_parameters(group)],
                    {tuple(dist.get_process_group_ranks(g)) for g in group.process_groups},
                )
            )
            module.reshard()
    found.append([_torch_private.reduce_scatter_numels(layer) for layer in model])
    # read with a default (False: a torch that sends no zeros for unused parameters), so a
    # rename would pass silently: that the pinned torch has it is checked here
    groups = [g for layer in model for g in _torch_private._state_param_groups(layer)]
    found.append(all(hasattr(g, "reduce_scatter_unused_params") for g in groups))
    return found


def test_the_per_instance_fsdp_apis_exist_on_a_real_fsdp2_model():
    found = run_distributed(_fsdp_state, 2, timeout=60)[0]
    # The root holds no parameters of its own; layer 0 holds weight (8, 8) and bias (8,),
    # which take 64 and 8 elements of its reduce-scatter input; layer 1's weight (3, 8) and
    # bias (3,) are padded to 4 rows for 2 ranks: 32 and 4, not 24 and 3.
    assert found == [2, ([(4, 8), (4,)], [(8, 8), (8,)], {(0, 1)}), [[64, 8], [32, 4]], True]


def _renamed_param_groups(rank, world_size):
    model = nn.Linear(8, 8)
    fully_shard(model, mesh=cp.fsdp.cpu_mesh())
    state = model._get_fsdp_state()
    for name in ("_fsdp_param_groups", "_fsdp_param_group"):  # torch 2.13's, or 2.11's
        vars(state).pop(name, None)  # what a torch release that renamed it would look like
    try:
        cp.fsdp.compress(model)  # its dtype checks read the parameter groups
    except PrivateAPIMissing as error:
        return str(error)
    return None


def test_a_renamed_fsdp_attribute_fails_loudly_instead_of_skipping_checks():
    message = run_distributed(_renamed_param_groups, 2, timeout=60)[0]
    assert message is not None and "FSDPState._fsdp_param_groups" in message


class _OlderModule:
    """An FSDP2 module as torch 2.11 shows it: its state holds ``_fsdp_param_group`` (one
    group, or None for a module without parameters of its own), no list."""

    def __init__(self, group):
        self._state = type("FSDPStateBefore213", (), {"_fsdp_param_group": group})()

    def _get_fsdp_state(self):
        return self._state


def _older_layout(rank, world_size):
    model = nn.Linear(8, 8)
    fully_shard(model, mesh=cp.fsdp.cpu_mesh())
    (group,) = _torch_private._state_param_groups(model)
    older = _OlderModule(group)
    seen = []
    _torch_private.wrap_fsdp_collectives(older, "all_gather", lambda c: seen.append(c) or c)
    groups = _torch_private.fsdp_param_groups(older)
    return (
        len(seen),
        [tuple(s.to_local().shape) for g in groups for s in g.sharded],
        _torch_private.fsdp_param_groups(_OlderModule(None)),
    )


def test_the_single_parameter_group_of_older_torch_releases_is_read():
    wrapped, shards, without_parameters = run_distributed(_older_layout, 2, timeout=60)[0]
    assert (wrapped, shards, without_parameters) == (1, [(4, 8), (4,)], [])


def test_a_group_whose_backend_keeps_no_options_has_no_timeout_to_read(monkeypatch):
    """A backend without options (MPI, one registered from Python) or a device without a
    backend made every hook and compress() without timeout= raise PrivateAPIMissing, as if
    torch had renamed something; such groups take torch's default again (None)."""
    from types import SimpleNamespace

    from commpress import _torch_private

    def no_backend(device):
        raise RuntimeError("No backend type associated with device type cpu")

    monkeypatch.setattr(_torch_private.dist, "get_backend_config", lambda group: "cpu:mpi")
    without_options = SimpleNamespace(_get_backend=lambda device: SimpleNamespace())
    assert _torch_private.group_timeout(without_options) is None
    assert _torch_private.group_timeout(SimpleNamespace(_get_backend=no_backend)) is None
    with_options = SimpleNamespace(
        _get_backend=lambda device: SimpleNamespace(options=SimpleNamespace(_timeout=7))
    )
    assert _torch_private.group_timeout(with_options) == 7
