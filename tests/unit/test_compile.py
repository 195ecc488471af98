"""Regional torch.compile (``bertforge.speed.compile_layers``): compiled == eager,
no recompile per batch.

Inductor on the CPU (it needs a C++ compiler; the test skips without one). Each test compiles
a layer's graphs once, with dynamic shapes (the attention kernel of the unpadded path stays eager
between them), about 10-30 s on 2 cores.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from bertforge.data.collate.mlm import collate_rows
from bertforge.models import BertConfig, BertForPreTraining
from bertforge.tasks.mlm import pretraining_loss
from bertforge.speed import (compile_layers, set_gradient_checkpointing,
                                         set_unpadding)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                 reason="inductor needs a C++ compiler on the CPU")]
TOL = dict(atol=1e-4, rtol=1e-4)


def batches(widths: list[int], seed: int = 0) -> list[dict]:
    """Micro-batches of 6 sequences with the longest of ``widths[i]`` tokens each: every batch a
    new shape, unpadded token counts and padded widths alike."""
    rng = np.random.default_rng(seed)
    out = []
    for width in widths:
        lengths = [width, *rng.integers(4, width, 5)]
        rows = []
        for n in lengths:
            labels = np.where(rng.random(n) < 0.2, rng.integers(5, 300, n), -100)
            labels[1] = 7
            rows.append((rng.integers(5, 300, n), (np.arange(n) >= n // 2).astype(np.int64),
                         labels, int(rng.integers(0, 2))))
        out.append(collate_rows(rows, pad_id=0, pad_to_multiple_of=8))
    return out


def losses_and_grads(model: torch.nn.Module, data: list[dict]) -> list[tuple]:
    out = []
    for batch in data:
        model.zero_grad()
        loss = pretraining_loss(model, batch).loss
        loss.backward()
        out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    return out


@pytest.mark.parametrize("unpad", [True, False])
def test_compiled_layers_equal_eager_without_a_recompile_per_batch(unpad) -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    eager = BertForPreTraining(config)
    set_unpadding(eager, unpad)
    compiled = BertForPreTraining(config)
    compiled.load_state_dict(eager.state_dict())
    set_unpadding(compiled, unpad)
    set_gradient_checkpointing(compiled, True)  # compiled layers run under checkpointing too
    compile_layers(compiled)
    assert list(compiled.state_dict()) == list(eager.state_dict())  # names unchanged

    data = batches([40, 17, 63, 25, 52, 33])
    graphs = []
    for batch, (loss_a, grads_a) in zip(data, losses_and_grads(eager, data)):
        ((loss_b, grads_b),) = losses_and_grads(compiled, [batch])
        graphs.append(counters["stats"]["unique_graphs"])
        torch.testing.assert_close(loss_b, loss_a, **TOL)
        for name in grads_a:
            torch.testing.assert_close(grads_b[name], grads_a[name], **TOL, msg=name)
    # The first batch compiles dynamic-shape graphs; no later batch shape compiles anything
    # (torch's default would compile static graphs first, then again with dynamic shapes).
    assert graphs[0] > 0 and graphs == [graphs[0]] * len(graphs), graphs


def test_generation_runs_eagerly_on_a_model_compiled_for_training() -> None:
    """Summarization evaluation generates with the training model. Each decoding step has a new
    cache length, so decoding through the compiled layers would recompile them step after step
    (on CPU one decoder layer reached 7 of torch's 8 allowed recompiles); generation runs eagerly
    instead and gives the eager model's tokens."""
    from torch._dynamo.utils import counters

    from bertforge.models.generation import GenerationConfig
    from bertforge.models.generation.texts import generate_texts
    from bertforge.models.bart import BartForConditionalGeneration
    from bertforge.models.bart_config import BartConfig

    class Ids:  # the tokenizer's one method generate_texts calls
        @staticmethod
        def decode_batch(rows, skip_special_tokens):
            return [" ".join(map(str, r)) for r in rows]

    torch.manual_seed(0)
    config = BartConfig.from_preset("bart-tiny", vocab_size=61, dropout=0.0)
    eager = BartForConditionalGeneration(config)
    compiled = BartForConditionalGeneration(config)
    compiled.load_state_dict(eager.state_dict())
    compile_layers(compiled)
    settings = GenerationConfig.from_model_config(config, max_length=12, num_beams=2)
    sources = [np.arange(5, 5 + n) for n in (9, 4, 7)]
    torch._dynamo.reset()
    counters.clear()
    texts = generate_texts(compiled, Ids, sources, settings, batch_size=2,
                           device=torch.device("cpu"))
    assert counters["stats"]["unique_graphs"] == 0
    assert texts == generate_texts(eager, Ids, sources, settings, batch_size=2,
                                   device=torch.device("cpu"))
