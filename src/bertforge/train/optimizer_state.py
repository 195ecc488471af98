"""The optimizer state of FSDP runs: written sharded (torch.distributed.checkpoint, one file
per rank, keyed by parameter name) and read back into any layout, sharded or not; an unsharded
``optimizer.pt`` reads into shards too. The checkpoint directory itself is
``bertforge.train.checkpoint``'s."""

from __future__ import annotations

from pathlib import Path

import torch

from bertforge.errors import CheckpointError
from bertforge.train.checkpoint import TrainingState


def save_sharded_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                           directory: Path) -> None:
    """Every rank writes its shard of the optimizer state of an FSDP ``model`` into
    ``directory`` (torch.distributed.checkpoint: keys are parameter names, so the state reads
    back into any number of ranks, sharded or not). A collective: every rank must call it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(directory, sync_files=True))


def restore_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      state: TrainingState, sharded: bool) -> None:
    """Load ``state``'s optimizer state into ``optimizer`` whichever layout saved it and
    whichever this run has (``sharded``: ``model`` is FSDP-sharded). An unsharded state into an
    unsharded run is plain ``load_state_dict``; the other three cases go through parameter
    names (torch.distributed.checkpoint.state_dict). A collective when ``sharded`` or when the
    state is sharded: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    if state.optimizer is not None and not sharded:
        optimizer.load_state_dict(state.optimizer)
        return
    _init_optimizer_state(optimizer)
    if state.optimizer is not None:  # optimizer.pt of a DDP or one-process run, into shards
        named = _by_name(model, optimizer, state.optimizer)
        set_optimizer_state_dict(model, optimizer, named,
                                 options=StateDictOptions(full_state_dict=True))
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    directory = state.sharded_optimizer
    assert directory is not None
    template = get_optimizer_state_dict(model, optimizer)  # this run's layout, filled in place
    try:
        # Partial: a parameter that never had a gradient has no saved state; it keeps zeros.
        dcp.load(template, storage_reader=dcp.FileSystemReader(directory),
                 planner=DefaultLoadPlanner(allow_partial_load=True))
    except Exception as exc:  # noqa: BLE001 (torch wraps every rank's failure in its own type)
        raise CheckpointError(f"{directory}: the sharded optimizer state cannot be read "
                              f"({_first_line(exc)}); the checkpoint is damaged. Resume from an "
                              "older checkpoint or with resume=none.") from exc
    set_optimizer_state_dict(model, optimizer, template)


def _init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the state of every parameter before a load into it. Without this, torch creates
    it with a zero-gradient step at lr=0 (see torch.distributed.checkpoint.state_dict)."""
    init = getattr(optimizer, "init_state", None)
    if init is not None and not optimizer.state:
        init()


def _by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> dict:
    """``optimizer.state_dict()`` of an unsharded run (parameters as indices, in the order of
    the optimizer's groups) keyed by parameter names, as torch's sharded loaders expect."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    saved_ids = [i for group in saved.get("param_groups", []) for i in group["params"]]
    if len(saved_ids) != len(order):
        raise CheckpointError(f"the saved optimizer state covers {len(saved_ids)} parameters, "
                              f"this model has {len(order)}; it is not this model's checkpoint")
    name_of = dict(zip(saved_ids, order))
    return {"state": {name_of[i]: s for i, s in saved["state"].items()},
            "param_groups": [{**g, "params": [name_of[i] for i in g["params"]]}
                             for g in saved["param_groups"]]}


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:240] + "...") if len(text) > 240 else (text or type(exc).__name__)
