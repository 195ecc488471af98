"""A message put together from parts says each thing once.

An error re-raised with context ("model X: ...") around a message that already names X, or
with advice the message already gives, reads as a stutter: "model /m: /m holds no tokenizer:
expected ... vocab.txt ...; fine-tuning needs the model's tokenizer files (vocab.txt, ...)".
The server's lost-batch 503 is another case (tests/faults/test_replica_faults.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.errors import UserError


@pytest.fixture
def no_tokenizer(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "bert"}))
    return model


def _loaders() -> list:
    from bertforge.inference.pipelines import load_pipeline
    from bertforge.tasks.finetuning import read_tokenizer

    return [read_tokenizer, lambda path: load_pipeline(path, "fill-mask", device="cpu")]


@pytest.mark.parametrize("which", [0, 1], ids=["finetune", "pipeline"])
def test_a_missing_tokenizer_is_named_once(which: int, no_tokenizer: Path) -> None:
    with pytest.raises(UserError) as refused:
        _loaders()[which](no_tokenizer)
    message = str(refused.value)
    assert message.count(str(no_tokenizer)) == 1, message
    assert message.count("vocab.txt") == 1, message
