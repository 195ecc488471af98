"""The evaluation pass (``bertforge.tasks.finetuning.predict``) batches features longest first
and returns every output in feature order."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import nn

from bertforge.data.batch import SequenceFeatures
from bertforge.tasks.finetuning import predict
from bertforge.train.distributed import DistInfo


class _Recorder(nn.Module):
    """Per row: the sum of its real token ids, and the ids themselves as a per-token output."""

    def __init__(self) -> None:
        super().__init__()
        self.widths: list[tuple[int, int]] = []  # (rows, width) of every batch

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        self.widths.append(tuple(input_ids.shape))
        return {"total": (input_ids * attention_mask).sum(-1), "tokens": input_ids * attention_mask}


def test_batches_run_longest_first_and_outputs_come_back_in_feature_order() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 40, size=23)
    width = 40
    ids = np.zeros((23, width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(5, 100, size=n)
        mask[i, :n] = 1
    features = SequenceFeatures({"input_ids": ids, "attention_mask": mask,
                                 "token_type_ids": np.zeros_like(ids)})
    model = _Recorder()

    def outputs(out: dict, batch: dict) -> dict[str, torch.Tensor]:
        tokens = out["tokens"]
        padded = torch.nn.functional.pad(tokens, (0, width - tokens.shape[1]))
        return {"total": out["total"], "tokens": padded}

    got = predict(model, features, 5, DistInfo(rank=0, world_size=1, local_rank=0,
                                               device=torch.device("cpu")),
                  contextlib.nullcontext, outputs)
    np.testing.assert_array_equal(got["total"], (ids * mask).sum(-1))
    np.testing.assert_array_equal(got["tokens"], ids * mask)
    # Longest first: each batch is as wide as its longest feature (rounded up to 8), and no
    # batch is wider than the one before.
    batch_widths = [w for _, w in model.widths]
    assert batch_widths == sorted(batch_widths, reverse=True)
    assert batch_widths[0] == 40 and batch_widths[-1] == -(-int(np.sort(lengths)[:3].max()) // 8) * 8
    assert [rows for rows, _ in model.widths] == [5, 5, 5, 5, 3]
