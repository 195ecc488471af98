"""optim.name=muon: which parameters Muon takes, that the combined optimizer is exactly
torch.optim.Muon plus torch.optim.AdamW, that a schedule drives both, exact resume, errors."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from bertforge.config import ConfigError, PretrainConfig
from bertforge.core.schema import load_config
from bertforge.models import BertConfig, BertForPreTraining, get_preset
from bertforge.optim import build_optimizer, build_scheduler, needs_external_clipping
from bertforge.optim.muon import MuonAdamW, split_muon

LR, WD, BETAS, EPS = 2e-2, 0.01, (0.9, 0.98), 1e-6


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(6, 12)
        self.down = nn.Linear(12, 6, bias=False)
        self.norm = nn.LayerNorm(6)


class Toy(nn.Module):
    """An embedding tied to its output projection, two blocks in a ModuleList, a small head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 6)
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(6, 3)
        self.decoder = nn.Linear(6, 20, bias=False)
        self.decoder.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.layers:
            x = block.norm(x + block.down(torch.relu(block.up(x))))
        return self.decoder(x).logsumexp(-1).sum() + self.head(x).square().sum()


def names(model: nn.Module, ids: set[int]) -> set[str]:
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_muon_takes_the_block_matrices_only() -> None:
    model = Toy()
    assert names(model, split_muon(model)) == {
        "layers.0.up.weight", "layers.0.down.weight", "layers.1.up.weight", "layers.1.down.weight"}
    bert = BertForPreTraining(BertConfig(**{**get_preset("bert-mini-preln"), "vocab_size": 64}))
    chosen = names(bert, split_muon(bert))
    assert chosen and all(".layer." in n and n.endswith(".weight") for n in chosen)
    per_layer = {n.split(".layer.")[1].split(".", 1)[1] for n in chosen}
    assert not any("norm" in n.lower() for n in per_layer), per_layer
    assert len(chosen) == len(per_layer) * 4  # bert-mini: 4 layers, the same matrices in each


def steps(model: nn.Module, opt: torch.optim.Optimizer, n: int, seed: int, sched=None) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        model(torch.randint(0, 20, (4, 5), generator=gen)).backward()
        opt.step()
        if sched is not None:
            sched.step()


def test_is_torch_muon_plus_torch_adamw_bit_for_bit() -> None:
    torch.manual_seed(0)
    ours_model = Toy()
    ref_model = Toy()
    ref_model.load_state_dict(ours_model.state_dict())
    ours = build_optimizer(ours_model, "muon", lr=LR, weight_decay=WD, betas=BETAS, eps=EPS)
    assert isinstance(ours, MuonAdamW) and needs_external_clipping(ours)
    chosen = split_muon(ref_model)
    matrices = [p for p in ref_model.parameters() if id(p) in chosen]
    decay = [p for n, p in ref_model.named_parameters()
             if id(p) not in chosen and p.ndim == 2]
    no_decay = [p for n, p in ref_model.named_parameters()
                if id(p) not in chosen and (p.ndim < 2 or ".norm." in n)]
    decay = [p for p in decay if all(p is not q for q in no_decay)]
    muon = torch.optim.Muon(matrices, lr=LR, weight_decay=WD, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=LR, betas=BETAS, eps=EPS, fused=True)

    class Both:
        def zero_grad(self, set_to_none: bool = True) -> None:
            ref_model.zero_grad(set_to_none=set_to_none)

        def step(self) -> None:
            muon.step()
            adamw.step()

    steps(ours_model, ours, 5, seed=1)
    steps(ref_model, Both(), 5, seed=1)
    for (n, a), b in zip(ours_model.named_parameters(), ref_model.parameters()):
        assert torch.equal(a, b), n
    moved = ours_model.layers[0].up.weight.detach() - Toy().layers[0].up.weight.detach()
    assert moved.abs().max() > 0


def test_the_schedule_drives_both_halves() -> None:
    model = Toy()
    opt = build_optimizer(model, "muon", lr=LR, weight_decay=WD, betas=BETAS, eps=EPS)
    sched = build_scheduler(opt, "linear", total_steps=10, warmup=0.2)
    steps(model, opt, 3, seed=2, sched=sched)
    lrs = {g["lr"] for g in opt.param_groups}
    assert len(lrs) == 1 and 0 < lrs.pop() < LR
    assert {g["lr"] for g in opt._muon.param_groups} == {g["lr"] for g in opt._adamw.param_groups}
    assert opt._muon.param_groups[0] is opt.param_groups[0]


def test_resume_is_bitwise_the_uninterrupted_run() -> None:
    torch.manual_seed(3)
    a = Toy()
    b = Toy()
    opt_a = build_optimizer(a, "muon", lr=LR, weight_decay=WD, betas=BETAS, eps=EPS)
    sched_a = build_scheduler(opt_a, "linear", total_steps=12, warmup=0.25)
    steps(a, opt_a, 5, seed=4, sched=sched_a)
    buf = io.BytesIO()
    torch.save([a.state_dict(), opt_a.state_dict(), sched_a.state_dict()], buf)
    buf.seek(0)
    model_state, opt_state, sched_state = torch.load(buf, weights_only=True)
    b.load_state_dict(model_state)
    opt_b = build_optimizer(b, "muon", lr=LR, weight_decay=WD, betas=BETAS, eps=EPS)
    sched_b = build_scheduler(opt_b, "linear", total_steps=12, warmup=0.25)
    opt_b.load_state_dict(opt_state)
    sched_b.load_state_dict(sched_state)
    assert opt_b._muon.state is opt_b.state
    assert opt_b._adamw.param_groups[0] is opt_b.param_groups[1]
    assert any("momentum_buffer" in s for s in opt_b.state.values())
    steps(a, opt_a, 4, seed=5, sched=sched_a)
    steps(b, opt_b, 4, seed=5, sched=sched_b)
    for (n, x), y in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(x, y), n


def test_errors_name_the_setting() -> None:
    with pytest.raises(ValueError, match="no hidden matrices.*use adamw"):
        build_optimizer(nn.Sequential(nn.Linear(4, 4)), "muon", lr=LR, weight_decay=WD)
    with pytest.raises(ConfigError, match="optim.name=muon.*train.fsdp=false"):
        load_config(PretrainConfig, None, ["--optim.name=muon", "--train.fsdp=true"])
