"""``init_from`` a checkpoint whose vocabulary has the data's size but other tokens is refused,
naming both sides and the first token that differs (before, only sizes were compared and the run
shipped the checkpoint's vocabulary with the data's token ids)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from bertforge.errors import ConfigError
from bertforge.models import BertForPreTraining
from bertforge.tokenization import BertTokenizer
from bertforge.commands.train import pretrain


def test_same_size_other_tokens_is_an_error_naming_both_vocabularies(finished, tiny,
                                                                     tmp_path: Path,
                                                                     tiny_config) -> None:
    source = finished.ckpt(finished.steps)
    tokens = list(BertTokenizer.from_pretrained(source).vocab)
    i, j = tokens.index("the"), tokens.index("of")
    tokens[i], tokens[j] = tokens[j], tokens[i]  # same size, same tokens, other ids
    other = tmp_path / "other-vocab"
    BertForPreTraining.from_pretrained(source).save_pretrained(other, tokenizer=BertTokenizer(tokens))

    with pytest.raises(ConfigError) as caught:
        pretrain(tiny_config(tmp_path / "run", f"--init_from={other}"))
    message = str(caught.value)
    assert message.startswith(f"{other} was trained with another vocabulary than the data at "
                              f"{tiny.data}: {len(tokens)} vs {len(tokens)} tokens, first "
                              f"difference at id {min(i, j)}")
    assert f"--vocab {other}" in message
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").glob("checkpoint-*"))

    # The checkpoint's own vocabulary passes: same tokens, same ids.
    assert pretrain(tiny_config(tmp_path / "ok", f"--init_from={source}",
                                "--train.max_steps=1")).step == 1


def test_a_checkpoint_without_vocabulary_files_is_checked_by_size_with_a_warning(
        finished, tmp_path: Path, tiny_config, caplog) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(finished.ckpt(finished.steps), bare)
    for name in ("vocab.txt", "tokenizer.json", "checksums.sha256"):
        (bare / name).unlink()
    with caplog.at_level(logging.WARNING):
        assert pretrain(tiny_config(tmp_path / "run", f"--init_from={bare}",
                                    "--train.max_steps=1")).step == 1
    assert f"cannot compare the vocabulary of {bare} with the data's" in caplog.text
