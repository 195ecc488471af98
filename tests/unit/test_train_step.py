"""The one train step and the loop around it, on a 1-layer, 16-wide BERT and hand-made batches.

Checked by numbers: accumulation over micro-batches against one large batch and against the
mean-of-micro-batch-means definition computed by hand; clipping and the reported gradient norm;
fp16 overflow (step skipped, loss scale halved) and NaN losses in bf16/fp32 (weights, optimizer
state and checkpoints untouched); the learning rate and window averages the loop logs.
"""

from __future__ import annotations

import math

import pytest
import torch

from bertforge.models import BertConfig, BertForPreTraining
from bertforge.optim import build_optimizer, build_scheduler, schedule_lr
from bertforge.train.distributed import DistInfo
from bertforge.train.loop import Hooks, LoopConfig, Trainer, train_step
from bertforge.runtime.precision import build_precision
from bertforge.tasks.mlm import pretraining_loss

CPU = torch.device("cpu")
VOCAB = 50


@pytest.fixture(autouse=True)
def one_thread():
    """A 16-wide model runs fastest on one thread; on a busy shared CPU more threads spin."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_model(seed: int = 0) -> BertForPreTraining:
    """No dropout, so a batch's gradient does not depend on how it is split into micro-batches."""
    torch.manual_seed(seed)
    return BertForPreTraining(BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0))


def make_batch(seed: int, lengths: list[int], masked: list[int]) -> dict[str, torch.Tensor]:
    """A contracts.md micro-batch: row i has ``lengths[i]`` real tokens, two segments and
    ``masked[i]`` predicted positions (never [CLS] or padding). Padded to max(lengths)."""
    gen = torch.Generator().manual_seed(seed)
    b, s = len(lengths), max(lengths)
    ids = torch.randint(5, VOCAB, (b, s), generator=gen)
    attention = (torch.arange(s)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = ids * attention                                   # [PAD] = 0 after each row's end
    types = ((torch.arange(s)[None, :] >= torch.tensor(lengths)[:, None] // 2) & attention.bool())
    labels = torch.full((b, s), -100)
    for i, (n, k) in enumerate(zip(lengths, masked)):
        pos = 1 + torch.randperm(n - 1, generator=gen)[:k]  # skip [CLS] at 0
        labels[i, pos] = ids[i, pos]
        ids[i, pos] = 4                                     # [MASK]
    return {"input_ids": ids, "attention_mask": attention, "token_type_ids": types.long(),
            "mlm_labels": labels, "nsp_labels": torch.randint(0, 2, (b,), generator=gen)}


def split(batch: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    """Micro-batches of ``size`` rows, each trimmed to its own longest row as the collator does."""
    out = []
    for start in range(0, batch["input_ids"].shape[0], size):
        part = {k: v[start:start + size] for k, v in batch.items()}
        s = int(part["attention_mask"].sum(1).max())
        out.append({k: (v[:, :s] if v.dim() == 2 else v) for k, v in part.items()})
    return out


class ConstantLR:
    """The scheduler protocol with a fixed rate (keeps SGD deltas equal to -lr * grad)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self) -> None:
        pass

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]


def sgd_delta(model: torch.nn.Module, micro_batches: list[dict], loss_fn=pretraining_loss,
              clip_norm: float = 0.0):
    """Run one train_step with plain SGD (lr 1): the weight change is minus the (clipped) grad."""
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=1.0)
    out = train_step(model, micro_batches, loss_fn, opt, ConstantLR(opt),
                     build_precision("fp32", CPU), params, clip_norm)
    return [p.detach() - b for p, b in zip(params, before)], out


def assert_deltas_close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    # A delta is the difference of two fp32 weights, so it carries their rounding: a LayerNorm
    # weight near 1.0 moves in steps of 1.2e-7 (one ulp there), and a change of a few ulps can
    # round one way in one run and the other way in the next (a different summation order).
    # The tolerance is 2 ulps at 1.0; a wrong scaling of any gradient is orders larger.
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=2 * torch.finfo(torch.float32).eps)


def test_four_micro_batches_equal_one_large_batch() -> None:
    # Every row predicts 3 tokens, so the mean over the 8 rows' 24 targets equals the mean of
    # the four micro-batch means; rows have different lengths, so micro-batches differ in S.
    batch = make_batch(0, lengths=[12, 7, 9, 12, 5, 10, 11, 6], masked=[3] * 8)
    whole, out_whole = sgd_delta(tiny_model(), [batch])
    parts, out_parts = sgd_delta(tiny_model(), split(batch, 2))
    assert sum(d.abs().sum() for d in whole) > 0
    assert_deltas_close(parts, whole)
    for name in ("loss", "mlm_loss", "nsp_loss"):
        torch.testing.assert_close(out_parts.stats[name], out_whole.stats[name],
                                   rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out_parts.grad_norm, out_whole.grad_norm, rtol=1e-5, atol=0.0)
    assert not out_parts.skipped and not out_whole.skipped


def test_accumulation_is_the_mean_of_micro_batch_means() -> None:
    # Unequal counts of predicted tokens: the step's loss is (1/4) sum_i mean_i, by definition.
    batch = make_batch(1, lengths=[12, 12, 9, 9, 10, 10, 8, 8], masked=[1, 4, 2, 2, 5, 1, 3, 1])
    micro = split(batch, 2)
    got, out = sgd_delta(tiny_model(), micro)

    model = tiny_model()
    losses = [pretraining_loss(model, b).loss for b in micro]
    by_hand = torch.autograd.grad(torch.stack(losses).mean(), list(model.parameters()),
                                  allow_unused=True)
    expected = [-(g if g is not None else torch.zeros_like(p))
                for g, p in zip(by_hand, model.parameters())]
    assert_deltas_close(got, expected)
    torch.testing.assert_close(out.stats["loss"], torch.stack(losses).mean().detach(),
                               rtol=1e-6, atol=1e-6)
    # The test can tell the definitions apart: one pooled batch weights tokens, not micro-batches.
    pooled, _ = sgd_delta(tiny_model(), [batch])
    assert max(float((x - y).abs().max()) for x, y in zip(got, pooled)) > 1e-4


def test_grad_norm_is_reported_before_clipping() -> None:
    batch = make_batch(2, lengths=[10, 8, 12, 6], masked=[2, 3, 2, 1])
    model = tiny_model()
    loss = pretraining_loss(model, batch).loss
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads if g is not None))

    delta, out = sgd_delta(tiny_model(), [batch], clip_norm=norm / 4)
    assert float(out.grad_norm) == pytest.approx(norm, rel=1e-5)
    applied = math.sqrt(sum(float(d.double().pow(2).sum()) for d in delta))
    assert applied == pytest.approx(norm / 4, rel=1e-4)       # clipped to the limit
    _, unclipped = sgd_delta(tiny_model(), [batch])
    assert float(unclipped.grad_norm) == pytest.approx(norm, rel=1e-5)


def poisoned(bad_calls: set[int], value: float):
    """A pretraining loss that is multiplied by ``value`` (inf, nan) on the given 1-based calls."""
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        out = pretraining_loss(model, batch)
        if calls["n"] in bad_calls:
            out.loss = out.loss * value
        return out

    return loss_fn


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def optimizer_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v.clone() for s in opt.state_dict()["state"].values() for v in s.values()
            if torch.is_tensor(v)]


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fp16_overflow_skips_the_step_and_halves_the_loss_scale() -> None:
    model = tiny_model()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = build_optimizer(model, "lamb", 1e-2, 0.01)
    sched = build_scheduler(opt, "poly", 10, 0.0)
    precision = build_precision("fp16", CPU)
    assert precision.scaler is not None and precision.scaler.get_scale() == 2.0**16
    loss_fn = poisoned({2}, float("inf"))                    # the second step overflows
    batch = make_batch(3, lengths=[12, 9, 10, 11], masked=[2, 2, 3, 1])

    def step():
        return train_step(model, [batch], loss_fn, opt, sched, precision, params, 0.0)

    out = step()
    assert not out.skipped and precision.scaler.get_scale() == 2.0**16
    weights, moments = snapshot(model), optimizer_tensors(opt)
    out = step()
    assert out.skipped and not torch.isfinite(out.grad_norm)
    assert same(snapshot(model), weights)                    # not a single weight moved
    assert all(torch.equal(a, b) for a, b in zip(optimizer_tensors(opt), moments))
    assert precision.scaler.get_scale() == 2.0**15
    assert all(p.grad is None for p in params)               # nothing leaks into the next step
    out = step()
    assert not out.skipped and not same(snapshot(model), weights)
    assert precision.scaler.get_scale() == 2.0**15          # grows only after 2000 good steps


# torch warns when a scheduler steps over a skipped optimizer step; skipping is the point here.
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")
@pytest.mark.parametrize("name", ["bf16", "fp32"])
def test_nan_loss_never_updates_weights(name: str) -> None:
    model = tiny_model()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = build_optimizer(model, "lamb", 1e-2, 0.01)
    sched = build_scheduler(opt, "poly", 10, 0.0)
    precision = build_precision(name, CPU)
    assert precision.scaler is None
    batch = make_batch(4, lengths=[12, 9, 10, 11], masked=[2, 2, 3, 1])
    loss_fn = poisoned({1}, float("nan"))
    weights = snapshot(model)
    out = train_step(model, [batch], loss_fn, opt, sched, precision, params, 0.0)
    assert out.skipped and math.isnan(float(out.grad_norm))
    assert same(snapshot(model), weights)
    assert opt.state_dict()["state"] == {}                   # LAMB never initialised moments
    out = train_step(model, [batch], loss_fn, opt, sched, precision, params, 0.0)
    assert not out.skipped and not same(snapshot(model), weights)


class Recorder:
    """Hooks that keep every logged line and a copy of the weights at every checkpoint."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.lines, self.saved, self.skips = model, [], {}, []

    def hooks(self) -> Hooks:
        return Hooks(log=lambda step, m: self.lines.append({"step": step, **m}),
                     checkpoint=lambda step: self.saved.__setitem__(step, snapshot(self.model)),
                     on_skip=lambda step, why: self.skips.append((step, why)))


def fit(model, loss_fn, batches, *, steps: int, log_every: int, precision: str = "fp32",
        accumulation: int = 1, lr: float = 1e-2, warmup: float = 0.5, schedule: str = "poly"):
    opt = build_optimizer(model, "lamb", lr, 0.01)
    sched = build_scheduler(opt, schedule, steps, warmup)
    rec = Recorder(model)
    trainer = Trainer(model, opt, sched, build_precision(precision, CPU), loss_fn,
                      DistInfo(rank=0, world_size=1, local_rank=0, device=CPU),
                      LoopConfig(max_steps=steps, accumulation=accumulation, log_every=log_every,
                                 checkpoint_every=1), rec.hooks())
    return trainer.fit(batches), rec


@pytest.mark.parametrize("name", ["bf16", "fp32"])
def test_nan_step_never_reaches_a_checkpoint(name: str) -> None:
    model = tiny_model()
    batches = [make_batch(10 + i, lengths=[12, 9, 10, 11], masked=[2, 2, 3, 1]) for i in range(4)]
    result, rec = fit(model, poisoned({3}, float("nan")), batches, steps=4, log_every=1,
                      precision=name, warmup=0.0, schedule="constant")
    assert result.step == 4 and result.skipped_steps == 1
    assert sorted(rec.saved) == [1, 2, 3, 4]
    for state in rec.saved.values():
        assert all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())
    assert same(rec.saved[3], rec.saved[2])                  # the NaN step changed nothing
    assert not same(rec.saved[4], rec.saved[3])              # and training went on
    assert [r["skipped_steps"] for r in rec.lines] == [0, 0, 1, 1]
    assert rec.skips == [(3, "non-finite gradients, weights not updated")]  # each skip is reported
    assert math.isnan(rec.lines[2]["grad_norm"]) and math.isfinite(rec.lines[3]["grad_norm"])


def test_loop_logs_the_rate_each_step_used_and_window_means() -> None:
    batches = [make_batch(20 + i, lengths=[12, 9, 10, 11], masked=[2, 2, 3, 1]) for i in range(8)]
    seen: list[float] = []

    def loss_fn(model, batch):
        out = pretraining_loss(model, batch)
        seen.append(float(out.loss.detach()))
        return out

    result, rec = fit(tiny_model(), loss_fn, batches, steps=4, log_every=2, accumulation=2,
                      lr=1e-2, warmup=0.5)
    assert result.step == 4 and [r["step"] for r in rec.lines] == [2, 4]
    for line in rec.lines:
        # lr: the rate of the window's last step (warm-up 2 steps of 4, then poly decay).
        assert line["lr"] == pytest.approx(schedule_lr(1e-2, line["step"], 4, 0.5), rel=1e-12)
        # loss: mean over the window's 2 steps of each step's mean over its 2 micro-batches.
        first = 4 * (line["step"] // 2 - 1)
        assert line["loss"] == pytest.approx(sum(seen[first:first + 4]) / 4, rel=1e-6)
        assert line["seq_per_s"] > 0 and line["tokens_per_s"] > line["seq_per_s"]
    assert [r["lr"] for r in rec.lines] == [schedule_lr(1e-2, 2, 4, 0.5), 0.0]


def test_each_micro_batch_is_fetched_when_its_forward_comes() -> None:
    """With k accumulation steps the loop takes micro-batch j from the loader only when the
    step reaches it, so the first forward never waits for k batches to be built (and copied)."""
    events: list[str] = []
    batches = [make_batch(30 + i, lengths=[12, 9, 10, 11], masked=[2, 2, 3, 1]) for i in range(6)]

    def stream():
        for i, batch in enumerate(batches):
            events.append(f"fetch {i}")
            yield {**batch, "index": torch.tensor(i)}

    def loss_fn(model, batch):
        events.append(f"forward {int(batch['index'])}")
        return pretraining_loss(model, batch)

    result, _ = fit(tiny_model(), loss_fn, stream(), steps=2, log_every=1, accumulation=3)
    assert result.step == 2
    assert events == [f"{what} {i}" for i in range(6) for what in ("fetch", "forward")]


def test_a_stream_that_ends_inside_a_step_is_an_error() -> None:
    from bertforge.errors import DataError

    batches = [make_batch(40 + i, lengths=[12, 9, 10, 11], masked=[2, 2, 3, 1]) for i in range(3)]
    with pytest.raises(DataError, match="ended after micro-batch 1 of an accumulation group of 2"):
        fit(tiny_model(), pretraining_loss, batches, steps=3, log_every=1, accumulation=2)
