"""Two gloo ranks with gathered embedding losses train like one process with the whole batch.

Each rank holds half of every batch (B = 4 of 8 rows) and a tiny DDP-wrapped encoder (no
dropout, whose masks would differ between layouts); with ``gather=True`` the loss and the
gradients equal one process's on all 8 rows (1e-6): info_nce with hard negatives, symmetric;
CoSENT over all pairs; and the cached (GradCache) pass under DDP and under FSDP2 over two
accumulation micro-steps, whose re-forwards sync gradients only on the last chunk of the last
micro-step. The index map is checked with embeddings that carry their own identity, and the
shape check with ranks that pass different batch sizes.
"""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor
from ranks import free_port
from torch import nn

from bertforge.errors import DataError
from bertforge.models import BertConfig, BertModel
from bertforge.tasks.embedding_cache import cached_embeddings
from bertforge.tasks.embedding_losses import column_pool, cosent, info_nce, target_indices
from bertforge.tasks.embedding_cache import _fsdp_sync
from bertforge.train.distributed import DistInfo, all_gather_with_grad, no_sync, shard_model

WORLD, B, SEQ, CHUNK = 2, 4, 10, 3
Wrap = Callable[[nn.Module], nn.Module]


def tiny_encoder() -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=16,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertModel(config, add_pooling_layer=False).train()


def texts(seed: int, rows: slice) -> dict[str, torch.Tensor]:
    """Rows ``rows`` of a fixed batch of WORLD * B texts."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, SEQ + 1, (WORLD * B,), generator=gen)
    mask = (torch.arange(SEQ)[None] < lengths[:, None]).long()             # (2B, S)
    ids = torch.randint(1, 50, (WORLD * B, SEQ), generator=gen) * mask
    return {"input_ids": ids[rows], "attention_mask": mask[rows]}


def joined(*parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def sync_flag(net: nn.Module) -> bool | None:
    """DDP's or FSDP2's gradient-sync flag (None for a bare model)."""
    if hasattr(net, "set_requires_gradient_sync"):
        return _fsdp_sync(net)
    return getattr(net, "require_backward_grad_sync", None)


def mean_pool(net: nn.Module, seen: list | None = None):
    def encode(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if seen is not None:  # (grad mode, gradient-sync flag) of every encoder call
            seen.append((torch.is_grad_enabled(), sync_flag(net)))
        hidden = net(inputs["input_ids"], inputs["attention_mask"]).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).float()               # (m, S, 1)
        return (hidden * mask).sum(1) / mask.sum(1)                         # (m, H)
    return encode


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, whole (FSDP2's shards gathered: a collective)."""
    return {name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
            for name, p in model.named_parameters()}


def fsdp2(model: nn.Module) -> nn.Module:
    shard_model(model, DistInfo(rank=dist.get_rank(), world_size=WORLD, local_rank=0,
                                device=torch.device("cpu")))
    return model


def run_info_nce(rows: slice, wrap: Wrap) -> dict:
    model = tiny_encoder()
    net = wrap(model)  # kept until after backward: a DDP wrapper gone by then reduces nothing
    q, d, n = (texts(seed, rows) for seed in (1, 2, 3))
    emb = mean_pool(net)(joined(q, d, n)).chunk(3)                          # 3 x (b, H)
    loss = info_nce(emb[0], [emb[1], emb[2]], symmetric=True).loss
    loss.backward()
    return {"loss": loss.detach(), "grads": grads(model)}


def run_cosent(rows: slice, wrap: Wrap) -> dict:
    model = tiny_encoder()
    net = wrap(model)
    scores = torch.tensor([0.9, 0.1, 0.5, 0.5, 0.0, 0.7, 0.3, 0.2])[rows]   # a tie: no pair
    a, b = mean_pool(net)(joined(texts(4, rows), texts(5, rows))).chunk(2)
    loss = cosent(a, b, scores).loss
    loss.backward()
    return {"loss": loss.detach(), "grads": grads(model)}


def run_cached(rows: slice, wrap: Wrap, cached: bool) -> dict:
    """Two accumulation micro-steps as ``train_step`` runs them: forward in ``no_sync``,
    backward after it closed; queries and documents in one cached call per micro-step."""
    model = tiny_encoder()
    net, seen, losses = wrap(model), [], []
    for step, sync in enumerate((False, True)):
        inputs = joined(texts(10 + step, rows), texts(20 + step, rows))   # (2b, S)
        with no_sync(net, sync=sync):
            encode = mean_pool(net, seen)
            emb = cached_embeddings(encode, inputs, CHUNK, net) if cached else encode(inputs)
            q, d = emb.chunk(2)
            loss = info_nce(q, [d]).loss / 2
        loss.backward()
        losses.append(loss.detach())
    return {"loss": torch.stack(losses), "grads": grads(model), "seen": seen}


def run_index_map(rank: int) -> dict:
    """Each row carries (global example id, column): column 0 the positive, 1-2 hard negatives."""
    ids = torch.tensor([[[rank * B + i, c] for c in range(3)] for i in range(B)],
                       dtype=torch.float32)                                 # (B, C, 2)
    try:
        all_gather_with_grad(torch.zeros(B + rank, 2))
        mismatch = ""
    except DataError as exc:
        mismatch = str(exc)
    return {"pool": column_pool(all_gather_with_grad(ids)), "targets": target_indices(B, rank),
            "mismatch": mismatch}


def worker(rank: int, port: int, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    try:
        rows = slice(rank * B, (rank + 1) * B)
        results = {"info_nce": run_info_nce(rows, nn.parallel.DistributedDataParallel),
                   "cosent": run_cosent(rows, nn.parallel.DistributedDataParallel),
                   "cached": run_cached(rows, nn.parallel.DistributedDataParallel, cached=True),
                   "cached_fsdp2": run_cached(rows, fsdp2, cached=True),
                   "index_map": run_index_map(rank)}
        torch.save(results, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("gather")
    # fork: the ranks inherit this process's imports (spawn re-imports torch and bertforge,
    # ~10 s on two cores); they run single-threaded (worker), as DataLoader workers do.
    ranks = mp.start_processes(worker, args=(free_port(), out), nprocs=WORLD, join=False,
                               start_method="fork")
    deadline = time.monotonic() + 120
    while not ranks.join(timeout=5):
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail("the two ranks did not finish within 120 s")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def identity(model: nn.Module) -> nn.Module:
    return model


def assert_grads(got: dict, want: dict) -> None:
    """Within 1e-6 of each tensor's largest entry (at least 1): the token-type gradient sums
    80 tokens, whose order of addition differs between layouts."""
    assert got.keys() == want.keys()
    for name in want:
        err, scale = (got[name] - want[name]).abs().max(), want[name].abs().max().clamp(min=1)
        assert err <= 1e-6 * scale, f"{name}: max difference {err:.2e}, largest entry {scale:.2e}"


def test_info_nce_on_two_ranks_equals_one_process(ranks: list[dict]) -> None:
    want = run_info_nce(slice(None), identity)
    # Each rank averages over its own anchors; DDP averages the two.
    mean = sum(r["info_nce"]["loss"] for r in ranks) / WORLD
    torch.testing.assert_close(mean, want["loss"], rtol=1e-6, atol=1e-6)
    for r in ranks:
        assert_grads(r["info_nce"]["grads"], want["grads"])


def test_cosent_on_two_ranks_equals_one_process(ranks: list[dict]) -> None:
    want = run_cosent(slice(None), identity)
    for r in ranks:  # every rank computes the loss of all pairs
        torch.testing.assert_close(r["cosent"]["loss"], want["loss"], rtol=1e-6, atol=1e-6)
        assert_grads(r["cosent"]["grads"], want["grads"])


def test_cached_pass_under_ddp_equals_one_uncached_process(ranks: list[dict]) -> None:
    want = run_cached(slice(None), identity, cached=False)
    mean = sum(r["cached"]["loss"] for r in ranks) / WORLD
    torch.testing.assert_close(mean, want["loss"], rtol=1e-6, atol=1e-6)
    for r in ranks:
        assert_grads(r["cached"]["grads"], want["grads"])
        # 8 rows in chunks of 3: three no-grad forwards, then three replays of which only the
        # last of the last micro-step syncs (the first micro-step ran under no_sync).
        unsynced, synced = [(False, False)] * 3, [(False, True)] * 3       # no-grad forwards
        replays = [(True, False)] * 3, [(True, False)] * 2 + [(True, True)]
        assert r["cached"]["seen"] == unsynced + replays[0] + synced + replays[1]


def test_cached_pass_under_fsdp2_equals_one_uncached_process(ranks: list[dict]) -> None:
    want = run_cached(slice(None), identity, cached=False)
    mean = sum(r["cached_fsdp2"]["loss"] for r in ranks) / WORLD
    torch.testing.assert_close(mean, want["loss"], rtol=1e-6, atol=1e-6)
    for r in ranks:
        assert_grads(r["cached_fsdp2"]["grads"], want["grads"])
        unsynced, synced = [(False, False)] * 3, [(False, True)] * 3
        replays = [(True, False)] * 3, [(True, False)] * 2 + [(True, True)]
        assert r["cached_fsdp2"]["seen"] == unsynced + replays[0] + synced + replays[1]


def test_no_anchor_meets_its_own_hard_negative_as_target(ranks: list[dict]) -> None:
    for rank, r in enumerate(ranks):
        pool, targets = r["index_map"]["pool"], r["index_map"]["targets"]
        assert pool.shape == (3 * WORLD * B, 2)
        for i, t in enumerate(targets.tolist()):
            example = rank * B + i
            assert pool[t].tolist() == [example, 0]                 # its own positive
            own = (pool[:, 0] == example).nonzero().flatten().tolist()
            assert sorted(pool[k, 1].item() for k in own) == [0, 1, 2]
            assert [k for k in own if pool[k, 1] > 0] and t not in [k for k in own
                                                                    if pool[k, 1] > 0]
        assert r["index_map"]["mismatch"] == (
            "all_gather_with_grad: the ranks passed different shapes (rank 0 (4, 2), rank 1 "
            "(5, 2)); every rank must pass the same: use a fixed micro-batch size and drop the "
            "last, smaller batch (drop_last)")
