"""``bertforge.speed.apply_speed_options``: speed applied from outside keeps every parameter
name and value and the outputs, swaps in the CPU kernels, and applying it twice changes nothing."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from bertforge.models import BertConfig
from bertforge.models.bert import (BertForMaskedLM, BertForPreTraining, BertForQuestionAnswering,
                                   BertForSequenceClassification, BertIntermediate)
from bertforge.ops.dropout import Dropout
from bertforge.ops.linear import Linear
from bertforge.speed import SpeedOptions, apply_speed_options
from bertforge.speed import FusedHeadTransform, FusedIntermediate

CONFIG = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=32, hidden_act="gelu_new")


@pytest.mark.parametrize("cls", [BertForPreTraining, BertForMaskedLM, BertForQuestionAnswering,
                                 BertForSequenceClassification])
def test_outputs_and_state_dict_are_kept(cls) -> None:
    torch.manual_seed(0)
    plain = cls(CONFIG).eval()
    fast = apply_speed_options(copy.deepcopy(plain))  # padded rows both: equal at padding too
    assert list(fast.state_dict()) == list(plain.state_dict())
    for name, tensor in plain.state_dict().items():
        assert torch.equal(fast.state_dict()[name], tensor), name
    ids = torch.randint(5, 64, (3, 17))
    mask = (torch.arange(17) < torch.tensor([[17], [4], [11]])).long()
    with torch.no_grad():
        want, got = plain(ids, mask), fast(ids, mask)
    for key, value in vars(want).items():
        torch.testing.assert_close(vars(got)[key], value, atol=2e-5, rtol=1e-4, msg=key)


def test_the_kernels_are_swapped_in_and_a_second_call_changes_nothing() -> None:
    model = apply_speed_options(BertForPreTraining(CONFIG))
    kinds = {type(m) for m in model.modules()}
    assert FusedIntermediate in kinds and FusedHeadTransform in kinds and Dropout in kinds
    assert nn.Dropout not in kinds and BertIntermediate not in kinds
    assert isinstance(model.bert.encoder.layer[0].intermediate.dense, Linear)
    before = [(n, type(m)) for n, m in model.named_modules()]
    hooks = len(model._forward_pre_hooks)
    apply_speed_options(model)
    assert [(n, type(m)) for n, m in model.named_modules()] == before
    assert len(model._forward_pre_hooks) == hooks == 1


def test_options_off_leave_the_plain_modules() -> None:
    model = apply_speed_options(BertForPreTraining(CONFIG),
                                SpeedOptions(cpu_kernels=False, partial_rows=False))
    assert {type(m) for m in model.modules()} == {type(m) for m in BertForPreTraining(CONFIG).modules()}
    assert not model._forward_pre_hooks


def test_training_steps_match_the_plain_model_without_dropout() -> None:
    torch.manual_seed(1)
    config = CONFIG.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    plain = BertForPreTraining(config)
    fast = apply_speed_options(copy.deepcopy(plain), unpad=True)
    ids = torch.randint(5, 64, (2, 12))
    positions = torch.tensor([1, 4, 13, 20])
    for model in (plain, fast):
        out = model(ids, masked_positions=positions)
        (out.mlm_logits.sum() + out.nsp_logits.sum()).backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), fast.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=2e-5, rtol=1e-4, msg=name)
