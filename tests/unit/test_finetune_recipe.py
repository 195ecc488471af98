"""Fine-tuning's recipe defaults against transformers' ``Trainer`` (issue 23, item 7): the parts
of a run that tests/parity/test_finetune_trainer_parity.py (optimizer, schedule, decay
exclusions, the train step) leaves out: the fresh head's draw and the pooler, dropout while
training on unpadded tokens, and the run's step count when the last batch of an epoch is partial.
benchmarks/README.md ("Recipe defaults against the Trainer") has the whole table."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from bertforge.data.loader import PretrainingLoader
from bertforge.models.loading import open_model
from bertforge.train.task import steps_for_epochs
from bertforge.train.guards import load_for_training
from bertforge.speed import apply_speed_options

transformers = pytest.importorskip("transformers")

# Wide enough for a tight estimate of the head's spread: 96 x 160 fresh classifier weights.
SHAPE = dict(vocab_size=64, hidden_size=96, num_hidden_layers=1, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=32, type_vocab_size=2,
             initializer_range=0.05, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
LABELS = 160


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face ``BertModel`` directory (encoder and pooler, no task head), as a
    sentence encoder such as MiniLM is published."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("encoder")
    transformers.BertModel(transformers.BertConfig(**SHAPE)).save_pretrained(path)
    return path


def ours(directory: Path, head: str = "sequence-classification", seed: int = 0,
         labels: int = LABELS) -> torch.nn.Module:
    source = open_model(str(directory))
    if head == "sequence-classification":
        source = source.replace(num_labels=labels)
    return load_for_training(source, head, torch.device("cpu"), seed=seed, checkpoint=None,
                             fallback="another directory", new_heads=True)


def test_fresh_classifier_is_drawn_as_the_trainers(encoder_dir: Path) -> None:
    """Normal with std ``initializer_range``, bias 0, on both sides; the pooler is the file's,
    not re-drawn (the classifier reads the pooled [CLS] vector on both sides)."""
    mine = ours(encoder_dir)
    theirs = transformers.BertForSequenceClassification.from_pretrained(
        encoder_dir, num_labels=LABELS)
    std = SHAPE["initializer_range"]
    for model in (mine, theirs):
        weight = model.classifier.weight.detach()
        assert weight.shape == (LABELS, SHAPE["hidden_size"])
        assert abs(float(weight.mean())) < 0.05 * std
        assert float(weight.std()) == pytest.approx(std, rel=0.05)
        assert torch.count_nonzero(model.classifier.bias) == 0
    torch.testing.assert_close(mine.bert.pooler.dense.weight, theirs.bert.pooler.dense.weight,
                               rtol=0, atol=0)
    # Each seed draws its own head; the encoder is the file's whatever the seed.
    other = ours(encoder_dir, seed=1)
    assert not torch.equal(other.classifier.weight, mine.classifier.weight)
    torch.testing.assert_close(other.bert.encoder.layer[0].output.dense.weight,
                               mine.bert.encoder.layer[0].output.dense.weight, rtol=0, atol=0)


def test_fresh_span_head_is_drawn_as_the_trainers(encoder_dir: Path) -> None:
    mine = ours(encoder_dir, "question-answering")
    theirs = transformers.BertForQuestionAnswering.from_pretrained(encoder_dir)
    for model in (mine, theirs):
        assert torch.count_nonzero(model.qa_outputs.bias) == 0
        assert float(model.qa_outputs.weight.detach().std()) == pytest.approx(
            SHAPE["initializer_range"], rel=0.2)  # 2 x 96 weights: a looser estimate
    assert not hasattr(mine.bert, "pooler") or mine.bert.pooler is None


def dropout_rates(model: torch.nn.Module) -> dict[str, float]:
    rates = {n: m.p for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout)}
    rates.update({n: m.dropout_p for n, m in model.named_modules() if hasattr(m, "dropout_p")})
    return rates


def test_dropout_rates_are_the_trainers(encoder_dir: Path) -> None:
    """Every dropout of the Trainer's model exists in ours at the same rate: embeddings, hidden,
    attention probabilities and the classifier's (``classifier_dropout`` falling back to
    ``hidden_dropout_prob``)."""
    mine = dropout_rates(ours(encoder_dir))
    theirs_model = transformers.BertForSequenceClassification.from_pretrained(
        encoder_dir, num_labels=LABELS)
    # Theirs are all nn.Dropout modules (attention's too); our attention passes its rate to the
    # kernel (``dropout_p``).
    theirs = {n: m.p for n, m in theirs_model.named_modules() if isinstance(m, torch.nn.Dropout)}
    assert len(mine) == len(theirs) and sorted(mine.values()) == sorted(theirs.values())
    assert mine["dropout"] == SHAPE["hidden_dropout_prob"]  # before the classifier


@pytest.mark.parametrize("unpad", [True, False])
def test_dropout_is_active_in_training_only(encoder_dir: Path, unpad: bool) -> None:
    """The model as the runner trains it (``train.unpad`` on by default): two forward passes in
    training mode differ, in evaluation mode they are equal; padding does not change that."""
    model = ours(encoder_dir, labels=2)
    apply_speed_options(model, unpad=unpad)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, SHAPE["vocab_size"], (4, 12), generator=gen)
    mask = (torch.arange(12)[None, :] < torch.tensor([12, 9, 5, 7])[:, None]).long()
    inputs = dict(input_ids=ids * mask, attention_mask=mask, token_type_ids=torch.zeros_like(ids))
    assert model.training
    first, second = (model(**inputs).logits for _ in range(2))
    assert not torch.allclose(first, second)
    model.eval()
    first, second = (model(**inputs).logits for _ in range(2))
    torch.testing.assert_close(first, second, rtol=0, atol=0)


class _Rows:
    """What the loader needs of a dataset to count and order its batches."""

    def __init__(self, n: int) -> None:
        self.lengths = [8] * n

    def __len__(self) -> int:
        return len(self.lengths)


@pytest.mark.parametrize("examples", [3260, 2490, 408, 33, 32, 31])
@pytest.mark.parametrize("epochs", [1.0, 2.5, 3.0])
def test_run_length_with_a_partial_last_batch_is_the_trainers(examples: int, epochs: float,
                                                             encoder_dir: Path,
                                                             tmp_path: Path) -> None:
    """The schedule's length: ``ceil(epochs x ceil(examples / batch))`` optimizer steps on both
    sides (MRPC's 3,260 training pairs in batches of 32: 102 per epoch, 306 in 3 epochs), with
    and without accumulation (the Trainer counts micro-batches, then divides rounding up)."""
    dataset = list(range(examples))
    model = transformers.BertForSequenceClassification(transformers.BertConfig(**SHAPE))
    for micro, k in ((32, 1), (16, 2)):
        loader = PretrainingLoader(_Rows(examples), global_batch_size=32, micro_batch_size=micro,
                                   rank=0, world_size=1, seed=0, drop_last=False,
                                   make_batch=lambda indices: indices)
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path), per_device_train_batch_size=micro,
            gradient_accumulation_steps=k, num_train_epochs=epochs, use_cpu=True,
            report_to="none")
        trainer = transformers.Trainer(model=model, args=args)
        dataloader = torch.utils.data.DataLoader(dataset, batch_size=micro)
        their_steps = trainer.set_initial_training_values(args, dataloader)[-1]
        assert steps_for_epochs(epochs, loader) == their_steps
        assert their_steps == math.ceil(epochs * math.ceil(examples / 32))
