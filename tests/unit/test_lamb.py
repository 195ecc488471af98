"""Lamb against a float64 reference, trust-ratio edge cases, state round trip, factory, clipping."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from torch import nn

from bertforge.optim import (
    Lamb,
    build_optimizer,
    clip_grad_norm_,
    global_grad_norm,
    needs_external_clipping,
    param_groups,
    split_decay,
)

B1, B2, EPS, WD, MAX_NORM = 0.9, 0.999, 1e-6, 0.01, 1.0
DECAY_SHAPES = [(7, 5), (3, 4, 2), (6, 6)]
NO_DECAY_SHAPES = [(5,), (11,)]


def reference_lamb(params, grads_per_step, lrs, *, adapt_all=False):
    """Plain float64 LAMB (NVIDIA FusedLAMB semantics). ``params``: list of (array, decays)."""
    w = [p.astype(np.float64) for p, _ in params]
    decays = [d for _, d in params]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    history, norms, clipped = [], [], []
    for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
        g = [x.astype(np.float64) for x in grads]
        norm = np.sqrt(sum(float((x**2).sum()) for x in g))
        norms.append(norm)
        clipped.append(norm > MAX_NORM)
        g = [x / max(norm / MAX_NORM, 1.0) for x in g]
        for i in range(len(w)):
            m[i] = B1 * m[i] + (1 - B1) * g[i]
            v[i] = B2 * v[i] + (1 - B2) * g[i] ** 2
            m_hat, v_hat = m[i] / (1 - B1**t), v[i] / (1 - B2**t)
            wd = WD if decays[i] else 0.0
            upd = m_hat / (np.sqrt(v_hat) + EPS) + wd * w[i]
            wn, un = np.linalg.norm(w[i]), np.linalg.norm(upd)
            trust = wn / un if (decays[i] or adapt_all) and wn > 0 and un > 0 else 1.0
            w[i] = w[i] - lr * trust * upd
        history.append([x.copy() for x in w])
    return history, norms, clipped


def make_problem(steps: int = 30, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(s, True) for s in DECAY_SHAPES] + [(s, False) for s in NO_DECAY_SHAPES]
    params = [(torch.randn(s, generator=gen), d) for s, d in shapes]
    # Alternating tiny and large gradients: the global norm (~10 * scale) crosses max_grad_norm.
    scales = [0.02, 1.0, 0.05, 3.0, 0.01]
    grads = [[torch.randn(s, generator=gen) * scales[t % len(scales)] for s, _ in shapes]
             for t in range(steps)]
    lrs = [0.02 * (1 + t % 4) / 4 for t in range(steps)]
    return params, grads, lrs


def build(tensors, decays):
    groups = [{"params": [t for t, d in zip(tensors, decays) if d], "weight_decay": WD},
              {"params": [t for t, d in zip(tensors, decays) if not d], "weight_decay": 0.0}]
    return Lamb(groups, lr=1.0, betas=(B1, B2), eps=EPS, max_grad_norm=MAX_NORM)


def drive(tensors, opt, grads_per_step, lrs):
    """Feed the given gradients and learning rates; returns weights and grad norms per step."""
    history, norms = [], []
    for grads, lr in zip(grads_per_step, lrs):
        for t, g in zip(tensors, grads):
            t.grad = g.clone()
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        for t, g in zip(tensors, grads):
            assert torch.equal(t.grad, g), "Lamb must not modify p.grad"
        norms.append(opt.last_grad_norm.item())
        history.append([t.detach().clone() for t in tensors])
    return history, norms


def run_lamb(params, grads_per_step, lrs):
    tensors = [nn.Parameter(p.clone()) for p, _ in params]
    opt = build(tensors, [d for _, d in params])
    history, norms = drive(tensors, opt, grads_per_step, lrs)
    return history, norms


def test_lamb_matches_float64_reference_with_and_without_clipping():
    params, grads, lrs = make_problem()
    ref, ref_norms, clipped = reference_lamb([(p.numpy(), d) for p, d in params],
                                             [[g.numpy() for g in gs] for gs in grads], lrs)
    assert any(clipped) and not all(clipped), "the test must exercise both regimes"
    ours, norms = run_lamb(params, grads, lrs)
    np.testing.assert_allclose(norms, ref_norms, rtol=1e-6)
    worst = 0.0
    for step_ours, step_ref in zip(ours, ref):
        for a, b in zip(step_ours, step_ref):
            err = np.abs(a.double().numpy() - b).max() / np.abs(b).max()
            worst = max(worst, err)
    assert worst < 2e-6, f"relative error vs float64 reference {worst:.3g}"
    # The trust ratio must really be off for the no-decay group: the variant that adapts every
    # tensor (FusedLAMB's use_nvlamb=True) ends up far away.
    nv, _, _ = reference_lamb([(p.numpy(), d) for p, d in params],
                              [[g.numpy() for g in gs] for gs in grads], lrs, adapt_all=True)
    nodecay = len(DECAY_SHAPES)
    assert np.abs(ours[-1][nodecay].numpy() - nv[-1][nodecay]).max() > 1e-3


def test_trust_ratio_zero_weights_uses_one():
    w = nn.Parameter(torch.zeros(4, 3))
    g = torch.linspace(-1, 1, 12).reshape(4, 3)
    w.grad = g.clone()
    Lamb([w], lr=0.1, weight_decay=WD, max_grad_norm=0.0).step()
    # step 1: m_hat = g, v_hat = g^2 -> update = g / (|g| + eps); trust 1 because ||w|| = 0
    expected = -0.1 * g / (g.abs() + 1e-6)
    torch.testing.assert_close(w.detach(), expected, rtol=1e-6, atol=1e-7)
    assert w.detach().abs().max() > 0.09


def test_trust_ratio_zero_update_keeps_weights_finite():
    # wd * w underflows to exactly 0 in float32 while ||w|| > 0: ||w|| / ||u|| would be inf and
    # inf * 0 = nan; the rule "1 when either norm is 0" keeps the weights as they are.
    w = nn.Parameter(torch.full((5,), 1e-30))
    w.grad = torch.zeros(5)
    Lamb([{"params": [w], "weight_decay": 1e-30}], lr=0.1).step()
    assert torch.equal(w.detach(), torch.full((5,), 1e-30))


def test_trust_ratio_scales_decay_only_update():
    # zero grads: update = wd * w, trust = ||w|| / (wd ||w||) = 1/wd, so w <- w * (1 - lr)
    w0 = torch.tensor([[3.0, -4.0], [1.0, 2.0]])
    w = nn.Parameter(w0.clone())
    w.grad = torch.zeros_like(w0)
    Lamb([w], lr=0.05, weight_decay=0.01).step()
    torch.testing.assert_close(w.detach(), w0 * 0.95, rtol=1e-6, atol=0)


def test_state_dict_round_trip_continues_identically():
    params, grads, lrs = make_problem(steps=16, seed=1)
    decays = [d for _, d in params]
    tensors = [nn.Parameter(p.clone()) for p, _ in params]
    opt = build(tensors, decays)
    drive(tensors, opt, grads[:8], lrs[:8])
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert sorted(float(s["step"]) for s in state["state"].values()) == [8.0] * len(params)

    clones = [nn.Parameter(t.detach().clone()) for t in tensors]
    restored = build(clones, decays)
    restored.load_state_dict(state)
    expected, _ = drive(tensors, opt, grads[8:], lrs[8:])
    got, _ = drive(clones, restored, grads[8:], lrs[8:])
    for a, b in zip(got[-1], expected[-1]):
        assert torch.equal(a, b)
    assert (got[-1][0] - params[0][0]).abs().max() > 1e-3  # training really moved the weights


def test_sparse_grads_and_bad_hyperparameters_are_rejected():
    emb = nn.Embedding(10, 4, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradients"):
        Lamb(emb.parameters()).step()
    # Library errors are ValueErrors naming Lamb's own parameters, with the config's ranges.
    with pytest.raises(ValueError, match=r"^betas\[1\] must be a finite number in \[0, 1\), got 1\.5"):
        Lamb([nn.Parameter(torch.ones(2))], betas=(0.9, 1.5))
    with pytest.raises(ValueError, match=r"^lr must be a finite number in \(0, 10\], got -1"):
        Lamb([nn.Parameter(torch.ones(2))], lr=-1)
    for bad in (float("inf"), float("nan"), 1e39, 0.0):
        with pytest.raises(ValueError, match="^lr must be"):
            Lamb([nn.Parameter(torch.ones(2))], lr=bad)


def test_step_hooks_run_and_grad_norm_is_exposed():
    w = nn.Parameter(torch.ones(3, 3))
    opt = Lamb([w])
    calls = []
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append(o.last_grad_norm.item()))
    w.grad = torch.full((3, 3), 2.0)
    opt.step()
    assert calls == [pytest.approx(6.0)]


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.dense = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.frozen = nn.Linear(4, 2)
        self.frozen.requires_grad_(False)


def test_param_groups_split_matrices_from_biases_and_norms():
    model = Tiny()
    decay, no_decay = split_decay(model)
    assert decay == ["emb.weight", "dense.weight"]
    assert no_decay == ["dense.bias", "norm.weight", "norm.bias"]
    groups = param_groups(model, 0.05)
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]
    assert [len(g["params"]) for g in groups] == [2, 3]


def test_build_optimizer():
    model = Tiny()
    lamb = build_optimizer(model, "lamb", lr=1e-3, weight_decay=0.01, max_grad_norm=2.0)
    assert isinstance(lamb, Lamb) and lamb.max_grad_norm == 2.0
    assert not needs_external_clipping(lamb)
    adamw = build_optimizer(model, "adamw", lr=1e-3, weight_decay=0.01, betas=(0.9, 0.98))
    assert isinstance(adamw, torch.optim.AdamW) and needs_external_clipping(adamw)
    assert [g["weight_decay"] for g in adamw.param_groups] == [0.01, 0.0]
    with pytest.raises(ValueError, match="^name must be one of lamb, adamw, decoupled_adamw, "
                       "stableadamw, decoupled_stableadamw, muon, got 'sgd'"):
        build_optimizer(model, "sgd", lr=1e-3, weight_decay=0.0)
    with pytest.raises(ValueError, match="no trainable parameters"):
        param_groups(nn.Linear(2, 2).requires_grad_(False), 0.01)


def test_clip_grad_norm_and_mixed_dtype_global_norm():
    a, b = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(4))
    a.grad, b.grad = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([0.0, 4.0, 0.0, 0.0])
    norm = clip_grad_norm_([a, b], 1.0)
    assert norm.item() == pytest.approx(5.0)
    torch.testing.assert_close(a.grad, torch.tensor([0.6, 0.0, 0.0]))
    torch.testing.assert_close(b.grad, torch.tensor([0.0, 0.8, 0.0, 0.0]))
    assert clip_grad_norm_([a, b], 10.0).item() == pytest.approx(1.0)   # below: untouched
    torch.testing.assert_close(a.grad, torch.tensor([0.6, 0.0, 0.0]))
    assert clip_grad_norm_([a, b], 0.0).item() == pytest.approx(1.0)    # off: measure only

    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(50, generator=gen) * 300 for _ in range(3)]
    mixed = [grads[0], grads[1].half(), grads[2].bfloat16()]            # 300^2 * 50 overflows fp16
    exact = np.sqrt(sum(float((g.double() ** 2).sum()) for g in mixed))
    assert global_grad_norm(mixed).item() == pytest.approx(exact, rel=1e-6)


def test_given_grad_norm_equals_the_computed_one() -> None:
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(3))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        p.grad = torch.randn_like(p) * 3
        q.grad = p.grad.clone()
    opt_a, opt_b = Lamb(a, lr=0.1, max_grad_norm=1.0), Lamb(b, lr=0.1, max_grad_norm=1.0)
    opt_a.step()
    opt_b.step(grad_norm=global_grad_norm([q.grad for q in b]))
    for p, q in zip(a, b):
        assert torch.equal(p, q)
