"""What moved down the layers (bertforge/core/layers.py) kept its behaviour, and serving needs
nothing of training: precision and device placement are ``bertforge.runtime``'s, generation's
settings and batched decoding ``bertforge.models.generation.texts``'s, the noise defaults and
the tokenizer's noise vocabulary ``bertforge.data.noising``'s."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.runtime.device import resolve_device

# Serve a BART summarizer and a BERT classifier, one request each, then list the trainer's
# modules that came in: the server's modules, the pipelines' loader, precision, device
# placement, generation, all of it.
_SERVE_CHILD = """
import sys
import bertforge.serve.app, bertforge.serve.execution, bertforge.serve.replica_worker
import bertforge.serve.server, bertforge.serve.startup_checks
from bertforge.inference.pipelines import load_pipeline

for model in sys.argv[1:]:
    pipe = load_pipeline(model, device="auto", precision="auto")
    print("answered", type(pipe([pipe.example()])[0]).__name__)
loaded = sorted(m for m in sys.modules if m.split(".")[:2] == ["bertforge", "train"])
print("train modules:", " ".join(loaded) or "none")
"""


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bertforge.models import BertConfig, BertForSequenceClassification
    from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

    tok = BertTokenizer([*SPECIAL_TOKENS, *"abcdefghijklmnopqrstuvwxyz.,?!", "the", "paris"])
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                        num_labels=2, finetuning_task="glue/sst2")
    torch.manual_seed(0)
    return BertForSequenceClassification(config).save_pretrained(
        tmp_path_factory.mktemp("layering") / "cls", tokenizer=tok)


def test_serving_imports_nothing_of_the_trainer(tiny_bart: Path, classifier: Path,
                                                child_env: dict[str, str]) -> None:
    child = subprocess.run([sys.executable, "-c", _SERVE_CHILD, str(tiny_bart), str(classifier)],
                           capture_output=True, text=True, env=child_env, timeout=300)
    assert child.returncode == 0, child.stderr
    lines = child.stdout.splitlines()
    assert lines.count("answered dict") == 2, child.stdout  # both pipelines really ran
    assert lines[-1] == "train modules: none"


def test_a_device_name_is_resolved_or_refused_with_what_to_type() -> None:
    # tests see no GPU (tests/conftest.py): auto is the CPU and a GPU asked for is refused
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"^device cuda:1 was asked for but no CUDA GPU is "
                                          r"available; use cpu$"):
        resolve_device("cuda:1")
    with pytest.raises(ConfigError, match=r"^device 'gpu0' is not a device; use auto, cpu, "
                                          r"cuda or cuda:N$"):
        resolve_device("gpu0")


def test_generation_pads_its_batches_as_the_seq2seq_collator_does() -> None:
    """Decoding pads with its own helper now (models sit below data): ids and mask must be the
    collator's ``pad_rows``, value for value and dtype for dtype."""
    from bertforge.data.collate.seq2seq import pad_rows
    from bertforge.models.generation.texts import _padded

    rng = np.random.default_rng(0)
    rows = [rng.integers(3, 50, size=n).astype(np.int64) for n in (5, 1, 9, 9, 2)]
    ids, mask = _padded(rows, pad_id=1)
    want_ids, want_mask = pad_rows(rows, 1)
    assert ids.dtype == mask.dtype == torch.int64
    np.testing.assert_array_equal(ids.numpy(), want_ids)
    np.testing.assert_array_equal(mask.numpy(), want_mask)


def test_inspect_shows_the_noise_a_pretraining_run_would_draw_by_default() -> None:
    """``bertforge inspect`` reads the default noise from data (below the configs): it must be
    the settings ``PretrainConfig``'s ``data.noise`` section starts from."""
    from bertforge.config import NoiseConfig
    from bertforge.data.noising import DEFAULT_NOISE

    assert NoiseConfig().spec() == DEFAULT_NOISE
