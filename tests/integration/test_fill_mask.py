"""fill-mask end to end: a tiny BERT pretrained by `bertforge pretrain` (masked LM + NSP, a few
CPU steps), then `bertforge predict fill-mask` on its final checkpoint. The candidates and their
scores must be those of transformers' own fill-mask pipeline on the same directory, and the
pretraining must have moved them (the untrained model ranks other tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.commands.train import pretrain

TEXTS = ["the keeper climbed the [MASK] every evening.", "[MASK] winter storms the waves rose."]
TOP_K = 4


def predicted(capsys: pytest.CaptureFixture, model: Path) -> list[list[dict]]:
    """Per text, the candidates of its one mask, from the command line (JSON Lines)."""
    args = [a for t in TEXTS for a in ("--text", t)]
    capsys.readouterr()
    assert main(["predict", "fill-mask", "--model", str(model), "--top-k", str(TOP_K),
                 "--json", *args]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [len(r["masks"]) for r in rows] == [1] * len(TEXTS)
    return [r["masks"][0] for r in rows]


def test_a_pretrained_checkpoint_fills_masks_as_transformers_does(
        tmp_path: Path, tiny_config, capsys: pytest.CaptureFixture) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = tiny_config(tmp_path / "run", "--train.max_steps=6", "--train.eval_batches=2")
    result = pretrain(cfg)
    assert result.step == 6 and set(result.validation) >= {"val_loss", "val_mlm_acc"}
    ckpt = result.final_checkpoint

    ours = predicted(capsys, ckpt)
    reference = transformers.pipeline("fill-mask", model=str(ckpt), device="cpu", top_k=TOP_K)
    vocab = reference.tokenizer.get_vocab()
    for text, candidates in zip(TEXTS, ours):
        theirs = reference(text)
        assert [vocab[c["token"]] for c in candidates] == [t["token"] for t in theirs], text
        assert [c["score"] for c in candidates] == pytest.approx(
            [t["score"] for t in theirs], abs=1e-5), text

    # The comparison can fail: the model before pretraining ranks other tokens.
    start = tmp_path / "start"
    pretrain(tiny_config(start, "--train.max_steps=1", "--optim.lr=1e-12",
                         "--train.eval_batches=0"))
    before = predicted(capsys, start / "checkpoint-1")
    assert [[c["token"] for c in m] for m in before] != [[c["token"] for c in m] for m in ours]
