"""StableAdamW and DecoupledAdamW against a float64 reference written from the paper's algorithm,
against torch.optim.AdamW where they must agree, exclusions, fp32 state, exact resume, errors."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from torch import nn

from bertforge.optim import (
    AdamWVariant,
    DecoupledAdamW,
    StableAdamW,
    build_optimizer,
    build_scheduler,
    needs_external_clipping,
)
from bertforge.train.syncs import SyncCounter, host_resident

B1, B2, EPS, WD, LR0 = 0.9, 0.98, 1e-6, 0.05, 0.02
DECAY_SHAPES = [(7, 5), (3, 4, 2), (6, 6)]
NO_DECAY_SHAPES = [(5,), (11,)]


def reference(params, grads_per_step, lrs, *, clip: bool, decouple: bool):
    """Float64 Algorithm 2 of Wortsman et al. 2023 as the paper writes it: debiased betas, so
    ``m`` and ``u`` are the bias-corrected moments themselves. ``params``: (array, decays) pairs.
    Returns the weights after each step and, per step, which tensors had their lr clipped."""
    w = [p.astype(np.float64) for p, _ in params]
    m = [np.zeros_like(x) for x in w]
    u = [np.zeros_like(x) for x in w]
    history, clipped = [], []
    for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
        b1_hat = B1 * (1 - B1 ** (t - 1)) / (1 - B1**t)
        b2_hat = B2 * (1 - B2 ** (t - 1)) / (1 - B2**t)
        step_clipped = []
        for i, g in enumerate(x.astype(np.float64) for x in grads):
            m[i] = b1_hat * m[i] + (1 - b1_hat) * g
            u[i] = b2_hat * u[i] + (1 - b2_hat) * g**2
            rms = np.sqrt(np.mean(g**2 / np.maximum(u[i], EPS**2)))
            eta = lr / max(1.0, rms) if clip else lr
            step_clipped.append(bool(clip and rms > 1.0))
            wd = WD if params[i][1] else 0.0
            decay = eta / LR0 * wd if decouple else eta * wd
            w[i] = w[i] - decay * w[i] - eta * m[i] / (np.sqrt(u[i]) + EPS)
        history.append([x.copy() for x in w])
        clipped.append(step_clipped)
    return history, clipped


def make_problem(steps: int = 12, seed: int = 0, shrink: float | None = None):
    """Weights, per-step gradients and scheduled lrs. Gradient scales jump up and down (so the
    update clipping triggers on some steps and not others), or, with ``shrink``, fall by that
    factor every step (so g^2 < v_hat and it never triggers)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(s, True) for s in DECAY_SHAPES] + [(s, False) for s in NO_DECAY_SHAPES]
    params = [(torch.randn(s, generator=gen), d) for s, d in shapes]
    scales = [1.0, 0.1, 4.0, 0.3, 10.0, 1.0]
    grads = [[torch.randn(s, generator=gen) * (shrink**t if shrink else scales[t % len(scales)])
              for s, _ in shapes] for t in range(steps)]
    lrs = [LR0 * (1 + t % 4) / 4 for t in range(steps)]  # below and at the peak, as a schedule
    return params, grads, lrs


def groups_of(tensors, decays):
    return [{"params": [t for t, d in zip(tensors, decays) if d], "weight_decay": WD},
            {"params": [t for t, d in zip(tensors, decays) if not d], "weight_decay": 0.0}]


def drive(tensors, opt, grads_per_step, lrs):
    history = []
    for grads, lr in zip(grads_per_step, lrs):
        for t, g in zip(tensors, grads):
            t.grad = g.to(t.dtype)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        history.append([t.detach().clone() for t in tensors])
    return history


def run(cls, params, grads, lrs, dtype=torch.float32, **kw):
    tensors = [nn.Parameter(p.clone().to(dtype)) for p, _ in params]
    opt = cls(groups_of(tensors, [d for _, d in params]), lr=LR0, betas=(B1, B2), eps=EPS, **kw)
    return drive(tensors, opt, grads, lrs), opt


def worst_relative_error(ours, ref) -> float:
    return max(float(np.abs(a.double().numpy() - b).max() / np.abs(b).max())
               for step_ours, step_ref in zip(ours, ref) for a, b in zip(step_ours, step_ref))


@pytest.mark.parametrize("decouple", [False, True])
def test_stable_adamw_matches_the_papers_algorithm_in_float64(decouple: bool) -> None:
    params, grads, lrs = make_problem()
    ref, clipped = reference([(p.numpy(), d) for p, d in params],
                             [[g.numpy() for g in gs] for gs in grads], lrs, clip=True,
                             decouple=decouple)
    flat = [c for step in clipped for c in step]
    assert any(flat) and not all(flat), "the test must exercise both regimes"
    ours64, _ = run(StableAdamW, params, grads, lrs, torch.float64, decouple_lr=decouple)
    assert worst_relative_error(ours64, ref) < 1e-12
    ours32, _ = run(StableAdamW, params, grads, lrs, torch.float32, decouple_lr=decouple)
    assert worst_relative_error(ours32, ref) < 2e-6
    # The clipping and the exclusions matter: without clipping, or with decay on every tensor,
    # the weights end up elsewhere.
    plain, _ = reference([(p.numpy(), d) for p, d in params],
                         [[g.numpy() for g in gs] for gs in grads], lrs, clip=False,
                         decouple=decouple)
    assert worst_relative_error(ours64, plain) > 1e-3
    everything, _ = reference([(p.numpy(), True) for p, _ in params],
                              [[g.numpy() for g in gs] for gs in grads], lrs, clip=True,
                              decouple=decouple)
    assert np.abs(ours64[-1][-1].numpy() - everything[-1][-1]).max() > 1e-4


def test_decoupled_adamw_matches_float64_reference() -> None:
    params, grads, lrs = make_problem(seed=1)
    ref, _ = reference([(p.numpy(), d) for p, d in params],
                       [[g.numpy() for g in gs] for gs in grads], lrs, clip=False, decouple=True)
    ours64, _ = run(DecoupledAdamW, params, grads, lrs, torch.float64, weight_decay=WD)
    assert worst_relative_error(ours64, ref) < 1e-12
    ours32, _ = run(DecoupledAdamW, params, grads, lrs, weight_decay=WD)
    assert worst_relative_error(ours32, ref) < 2e-6
    coupled, _ = reference([(p.numpy(), d) for p, d in params],
                           [[g.numpy() for g in gs] for gs in grads], lrs, clip=False,
                           decouple=False)
    assert worst_relative_error(ours64, coupled) > 1e-3


def torch_adamw(params, grads, lrs, weight_decay=WD, dtype=torch.float32):
    tensors = [nn.Parameter(p.clone().to(dtype)) for p, _ in params]
    groups = groups_of(tensors, [d for _, d in params])
    groups[0]["weight_decay"] = weight_decay
    opt = torch.optim.AdamW(groups, lr=LR0, betas=(B1, B2), eps=EPS, foreach=True)
    return drive(tensors, opt, grads, lrs)


def test_switches_off_is_torch_adamw_bit_for_bit() -> None:
    params, grads, lrs = make_problem(seed=2)
    expected = torch_adamw(params, grads, lrs)
    for got in (run(AdamWVariant, params, grads, lrs, weight_decay=WD)[0],
                run(DecoupledAdamW, params, grads, lrs, weight_decay=WD, decouple_lr=False)[0]):
        for a, b in zip(got[-1], expected[-1]):
            assert torch.equal(a, b)


def test_stable_adamw_without_clipping_is_torch_adamw() -> None:
    params, grads, lrs = make_problem(seed=3, shrink=0.3)
    _, clipped = reference([(p.numpy(), d) for p, d in params],
                           [[g.numpy() for g in gs] for gs in grads], lrs, clip=True,
                           decouple=False)
    assert not any(c for step in clipped for c in step), "the clipping must never trigger here"
    got, _ = run(StableAdamW, params, grads, lrs, weight_decay=WD)
    expected = torch_adamw(params, grads, lrs)
    for step_got, step_expected in zip(got, expected):
        for a, b in zip(step_got, step_expected):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_decoupled_decay_at_constant_lr_is_adamw_with_decay_over_lr() -> None:
    # lr == lr0 every step: the decay lr / lr0 * wd = wd is AdamW's lr * (wd / lr).
    params, grads, _ = make_problem(seed=4)
    lrs = [LR0] * len(grads)
    got, _ = run(DecoupledAdamW, params, grads, lrs, torch.float64, weight_decay=WD)
    expected = torch_adamw(params, grads, lrs, weight_decay=WD / LR0, dtype=torch.float64)
    for a, b in zip(got[-1], expected[-1]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("scale, clipped", [
    (1.0, True),     # rms = c sqrt((1 + b2) / (b2 + c^2)) = 1.34
    (1e-4, True),    # v_hat between eps^2 and eps: the floor is eps^2, not eps
    (1e-8, False),   # v_hat below eps^2: floored, so g^2 / eps^2 is tiny and nothing clips
])
def test_update_clipping_by_hand(scale: float, clipped: bool) -> None:
    # b1 = 0, step 2's gradient c times step 1's: v_hat = g^2 (b2 + c^2) / (1 + b2) everywhere,
    # and w moves by lr / max(1, rms) * g2 / (sqrt(v_hat) + eps).
    g = torch.tensor([[0.5, -1.0], [2.0, 0.25]], dtype=torch.float64) * scale
    c, lr = 3.0, 0.1
    w = nn.Parameter(torch.zeros_like(g))
    opt = StableAdamW([w], lr=lr, betas=(0.0, B2), eps=EPS, weight_decay=0.0)
    w.grad = g.clone()
    opt.step()                         # step 1: g^2 / v_hat = 1 (or less), rms <= 1: not clipped
    torch.testing.assert_close(w.detach(), -lr * g / (g.abs() + EPS), rtol=1e-14, atol=0)
    before = w.detach().clone()
    w.grad = c * g
    opt.step()
    v_hat = g**2 * (B2 + c * c) / (1 + B2)
    rms = float(((c * g) ** 2 / v_hat.clamp(min=EPS**2)).mean().sqrt())
    assert (rms > 1.3) == clipped
    expected = before - lr / max(1.0, rms) * (c * g) / (v_hat.sqrt() + EPS)
    torch.testing.assert_close(w.detach(), expected, rtol=1e-13, atol=0)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)


@pytest.mark.parametrize("name, decoupled", [("decoupled_adamw", True), ("stableadamw", False),
                                             ("decoupled_stableadamw", True)])
def test_factory_groups_and_exclusions(name: str, decoupled: bool) -> None:
    # Zero gradients: the Adam term is 0 (and rms 0, no clipping), only the decay moves weights.
    model = Tiny()
    opt = build_optimizer(model, name, lr=0.5, weight_decay=0.1, betas=(0.9, 0.98))
    assert isinstance(opt, StableAdamW if "stable" in name else DecoupledAdamW)
    assert needs_external_clipping(opt) and opt.decouple_lr == decoupled
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for group in opt.param_groups:
        group["lr"] = 0.25                          # half the peak, as a schedule would set
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    keep = 1 - (0.5 * 0.1 if decoupled else 0.25 * 0.1)
    torch.testing.assert_close(model.dense.weight.detach(), before["dense.weight"] * keep,
                               rtol=1e-6, atol=0)
    for n in ("dense.bias", "norm.weight", "norm.bias"):
        assert torch.equal(dict(model.named_parameters())[n].detach(), before[n]), n


def test_low_precision_parameters_keep_float32_moments() -> None:
    params, grads, lrs = make_problem(seed=5)
    got, opt = run(StableAdamW, params, grads, lrs, torch.bfloat16, decouple_lr=True)
    assert all(s["exp_avg"].dtype == torch.float32 and s["exp_avg_sq"].dtype == torch.float32
               for s in opt.state.values())
    assert all(t.dtype == torch.bfloat16 for t in got[-1])
    ref, _ = reference([(p.numpy(), d) for p, d in params],
                       [[g.bfloat16().double().numpy() for g in gs] for gs in grads], lrs,
                       clip=True, decouple=True)
    # Each step rounds the weights to bfloat16 once (8 bits): the drift stays a few roundings.
    assert worst_relative_error(got, ref) < 3e-2


def save_and_load(*objects) -> list[dict]:
    buf = io.BytesIO()
    torch.save([o.state_dict() for o in objects], buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("name, dtype", [("stableadamw", torch.float32),
                                         ("decoupled_stableadamw", torch.bfloat16),
                                         ("decoupled_adamw", torch.float32)])
def test_resume_is_bitwise_the_uninterrupted_run(name: str, dtype: torch.dtype) -> None:
    steps, stop = 14, 6
    params, grads, _ = make_problem(steps=steps, seed=6)

    def build(tensors):
        model = nn.ParameterList(tensors)
        opt = build_optimizer(model, name, lr=LR0, weight_decay=WD, betas=(B1, B2), eps=EPS)
        sched = build_scheduler(opt, "wsd", total_steps=steps, warmup=0.2, decay=0.5)
        return opt, sched

    def train(tensors, opt, sched, span):
        for t in span:
            for p, g in zip(tensors, grads[t]):
                p.grad = g.to(dtype)
            opt.step()
            sched.step()

    a = [nn.Parameter(p.clone().to(dtype)) for p, _ in params]
    opt_a, sched_a = build(a)
    train(a, opt_a, sched_a, range(stop))
    opt_state, sched_state = save_and_load(opt_a, sched_a)
    b = [nn.Parameter(p.detach().clone()) for p in a]
    opt_b, sched_b = build(b)
    opt_b.load_state_dict(opt_state)
    sched_b.load_state_dict(sched_state)
    assert all(s["exp_avg"].dtype == torch.float32 and s["step"].device.type == "cpu"
               for s in opt_b.state.values())
    train(a, opt_a, sched_a, range(stop, steps))
    train(b, opt_b, sched_b, range(stop, steps))
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert (a[0].detach().float() - params[0][0]).abs().max() > 1e-3  # training moved them


def test_step_waits_for_nothing_on_the_device() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    opt = build_optimizer(model, "decoupled_stableadamw", lr=1e-3, weight_decay=1e-5)
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        with SyncCounter(host_tensors=host_resident(opt, [])) as counter:
            opt.step()
    assert counter.total == 0, counter.counts


def test_sparse_grads_and_bad_hyperparameters_are_rejected() -> None:
    emb = nn.Embedding(10, 4, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="StableAdamW does not support sparse gradients"):
        StableAdamW(emb.parameters()).step()
    one = [nn.Parameter(torch.ones(2))]
    with pytest.raises(ValueError, match=r"^betas\[0\] must be a finite number in \[0, 1\), got 1"):
        StableAdamW(one, betas=(1.0, 0.98))
    with pytest.raises(ValueError, match=r"^lr must be a finite number in \(0, 10\], got 0"):
        DecoupledAdamW(one, lr=0)
    with pytest.raises(ValueError, match=r"^eps must be a finite number"):
        StableAdamW(one, eps=float("nan"))
    with pytest.raises(ValueError, match=r"^weight_decay must be a finite number in \[0, 1\]"):
        DecoupledAdamW(one, weight_decay=2.0)


def test_a_run_with_them_resumes_bitwise(tmp_path, tiny_config, run_metrics) -> None:
    """The train loop with decoupled_stableadamw and wsd, resumed from a checkpoint into a new
    directory, ends with the uninterrupted run's weights, byte for byte, at the same lrs."""
    from bertforge.optim import schedule_lr
    from bertforge.commands.train import pretrain

    extra = ("--optim.name=decoupled_stableadamw", "--optim.schedule=wsd", "--optim.warmup=0.2",
             "--optim.decay=0.5", "--optim.weight_decay=1e-3", "--optim.max_grad_norm=0",
             "--train.max_steps=6", "--checkpoint.every=3")
    first = pretrain(tiny_config(tmp_path / "a", *extra))
    checkpoint = tmp_path / "a" / "checkpoint-3"
    second = pretrain(tiny_config(tmp_path / "b", *extra, f"--resume={checkpoint}"))
    assert second.step == 6
    read = lambda run: (run.final_checkpoint / "model.safetensors").read_bytes()  # noqa: E731
    assert read(second) == read(first)
    lines = [r for r in run_metrics(tmp_path / "a") if "lr" in r]
    assert [r["step"] for r in lines] == list(range(1, 7))
    lr = tiny_config(tmp_path / "a", *extra).optim.lr
    assert [r["lr"] for r in lines] == pytest.approx(
        [schedule_lr(lr, r["step"], 6, 0.2, "wsd", decay=0.5) for r in lines], rel=1e-12)
    assert run_metrics(tmp_path / "b") == [r for r in run_metrics(tmp_path / "a") if r["step"] > 3]
