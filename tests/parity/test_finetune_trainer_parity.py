"""Fine-tuning with bertforge's defaults is transformers' ``Trainer`` step by step.

The same tiny BERT classifier (dropout off), the same batches in the same order: one copy trains
with bertforge's ``FinetuneConfig`` defaults through ``build_optimizer``, ``build_scheduler`` and
the train loop's ``train_step``; the other with the Trainer's own parts (``TrainingArguments``
defaults, ``create_optimizer_and_scheduler``, ``training_step`` with the Trainer's item count,
its clipping, then optimizer and scheduler steps, as its inner loop runs them). The learning rate
of every step must be equal and the weights after the last step equal to fp32 tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch

import bertforge.models as bf
from bertforge.config import FinetuneConfig, FinetuneOptimConfig
from bertforge.optim import build_optimizer, build_scheduler, needs_external_clipping
from bertforge.optim.build import split_decay
from bertforge.tasks.finetuning import choice_loss
from bertforge.train.loop import train_step
from bertforge.runtime.precision import build_precision

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=104,  # a multiple of 8: bertforge pads the table to one
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=64, type_vocab_size=2,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
LABELS, MICRO, SEQ = 3, 4, 12


def models(seed: int = 0):
    """(bertforge model, transformers model) with the same weights."""
    torch.manual_seed(seed)
    theirs = transformers.BertForSequenceClassification(
        transformers.BertConfig(**TINY, num_labels=LABELS))
    ours = bf.BertForSequenceClassification(bf.BertConfig(**TINY), num_labels=LABELS)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours.train(), theirs.train()


def batches(steps: int, k: int, seed: int = 1) -> list[list[dict]]:
    """``steps`` optimizer steps of ``k`` padded micro-batches each."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        group = []
        for _ in range(k):
            lengths = torch.randint(3, SEQ + 1, (MICRO,), generator=gen)
            mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
            ids = torch.randint(1, TINY["vocab_size"], (MICRO, SEQ), generator=gen) * mask
            types = ((torch.arange(SEQ)[None, :] >= lengths[:, None] // 2) & mask.bool()).long()
            labels = torch.randint(0, LABELS, (MICRO,), generator=gen)
            group.append(dict(input_ids=ids, attention_mask=mask, token_type_ids=types,
                              labels=labels))
        out.append(group)
    return out


def train_ours(model, groups, optim: FinetuneOptimConfig) -> list[float]:
    opt = build_optimizer(model, optim.name, optim.lr, optim.weight_decay, optim.betas,
                          optim.eps, optim.max_grad_norm)
    sched = build_scheduler(opt, optim.schedule, len(groups), optim.warmup, optim.power,
                            counting=optim.schedule_counting)
    params = [p for p in model.parameters() if p.requires_grad]
    clip = optim.max_grad_norm if needs_external_clipping(opt) else 0.0
    precision = build_precision("fp32", torch.device("cpu"))

    def loss_fn(m, batch):  # the classification task's loss
        logits = m(**{k: batch[k] for k in ("input_ids", "attention_mask",
                                             "token_type_ids")}).logits
        return choice_loss(logits, batch)

    lrs = []
    for group in groups:
        lrs.append(opt.param_groups[0]["lr"])
        train_step(model, group, loss_fn, opt, sched, precision, params, clip)
    return lrs


def train_theirs(model, groups, tmp_path, **overrides) -> list[float]:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=len(groups), per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=len(groups[0]), warmup_steps=0.1, use_cpu=True,
        report_to="none", **{"learning_rate": 5e-5, **overrides})
    trainer = transformers.Trainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=len(groups))
    lrs = []
    for group in groups:  # Trainer._run_epoch's inner loop, one update step per group
        items = trainer._get_num_items_in_batch(group, torch.device("cpu"))
        trainer.current_gradient_accumulation_steps = len(group)
        for inputs in group:
            trainer.training_step(model, dict(inputs), items)
        if args.max_grad_norm > 0:
            trainer._clip_grad_norm(model)
        lrs.append(trainer.optimizer.param_groups[0]["lr"])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad()
    return lrs


def test_defaults_are_the_trainers() -> None:
    ours, args = FinetuneConfig().optim, transformers.TrainingArguments(output_dir="unused")
    assert ours.name == "adamw" and getattr(args.optim, "value", args.optim).startswith("adamw_torch")
    assert (ours.lr, ours.schedule) == (args.learning_rate, "linear") == (5e-5, "linear")
    assert list(ours.betas) == [args.adam_beta1, args.adam_beta2]
    assert ours.eps == args.adam_epsilon
    assert ours.weight_decay == args.weight_decay
    assert ours.max_grad_norm == args.max_grad_norm
    assert ours.schedule_counting == "transformers"


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")
@pytest.mark.parametrize("total", [1, 2, 7, 10, 30, 115, 345])
@pytest.mark.parametrize("warmup", [0.0, 0.06, 0.1, 0.5])
def test_learning_rate_of_every_step(total: int, warmup: float) -> None:
    """Including ceil's rounding (345 x 0.1 -> 35 steps; 30 x 0.1 is 3.0000000000000004 -> 4)."""
    p = torch.nn.Parameter(torch.zeros(1))
    ours = build_scheduler(torch.optim.SGD([p], lr=5e-5), "linear", total, warmup,
                           counting="transformers")
    opt = torch.optim.SGD([p], lr=5e-5)
    theirs = transformers.get_scheduler("linear", opt, math.ceil(total * warmup), total)
    for _ in range(total + 2):
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12, abs=0)
        ours.step()
        theirs.step()


def test_decay_exclusions_match_the_trainers() -> None:
    ours, theirs = models()
    args = transformers.TrainingArguments(output_dir="unused", use_cpu=True, report_to="none")
    trainer = transformers.Trainer(model=theirs, args=args)
    decay, _ = split_decay(ours)
    assert sorted(decay) == sorted(trainer.get_decay_parameter_names(theirs))


# None: both sides' defaults; a strong decay at a high lr makes a difference in which parameters
# decay (the LayerNorm weights start at 1) show far above the tolerance.
@pytest.mark.parametrize("decay", [None, dict(lr=1e-3, weight_decay=0.1)])
def test_training_steps_match_the_trainer(decay, tmp_path) -> None:
    ours, theirs = models()
    start = {k: v.clone() for k, v in ours.state_dict().items()}
    groups = batches(steps=8, k=1)
    optim = FinetuneOptimConfig(**(decay or {}))
    their_args = {} if decay is None else {"learning_rate": decay["lr"],
                                           "weight_decay": decay["weight_decay"]}
    our_lrs = train_ours(ours, groups, optim)
    their_lrs = train_theirs(theirs, groups, tmp_path, **their_args)
    assert our_lrs == pytest.approx(their_lrs, rel=1e-12, abs=0)
    assert our_lrs[0] == 0.0 and max(our_lrs) == pytest.approx(optim.lr)
    theirs_state = theirs.state_dict()
    moved = 0.0
    for name, value in ours.state_dict().items():
        torch.testing.assert_close(value, theirs_state[name], rtol=1e-5, atol=1e-7, msg=name)
        moved = max(moved, float((value - start[name]).abs().max()))
    assert moved > 1e-5  # the runs trained (a comparison of untouched weights proves nothing)
