"""``bertforge bench inference``: the report's numbers follow from the timed calls, its inputs
are exactly ``--seq-length`` tokens, each precision's probe agreement is the pipeline's own, a
CPU without units is measured in fp32 only with the reason said, and user mistakes are one
``error:`` line. Timing itself belongs in benchmarks/: these runs take a few calls each."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.commands.bench import format_report
from bertforge.export.sentence_transformers import export_sentence_transformers
from bertforge.inference.bench import WORDS as BENCH_WORDS
from bertforge.inference.bench import BenchSettings, Timings, bench_requests, load, summarize
from bertforge.inference.pipelines import load_pipeline
from bertforge.models import (BertConfig, BertForMaskedLM, BertForQuestionAnswering,
                              BertForSequenceClassification)
from bertforge.runtime.cpu import EMULATION_VARIABLE, core_ids
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!:'-")
# The words of the bench's English text and of the pipelines' example items, so that most are
# one token, as with a real vocabulary.
EXAMPLES = "a sentence to embed gripping beautifully shot film where eiffel tower wrought iron"
WORDS = sorted({w.strip(".,?!:").lower() for w in [*BENCH_WORDS, *EXAMPLES.split()]} - {""})
FAST = ["--iterations", "2", "--warmup", "1", "--seq-length", "32", "--batch-size", "4"]


def _tiny(folder: Path, cls: type, **config: object) -> Path:
    tok = BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *CHARS, *[f"##{c}" for c in CHARS],
                                            *WORDS])))
    torch.manual_seed(0)
    model = cls(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64,
                           max_position_embeddings=128, **config))
    return model.save_pretrained(folder, tokenizer=tok)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT text classifier (its config.json names the task)."""
    return _tiny(tmp_path_factory.mktemp("bench") / "sst2", BertForSequenceClassification,
                 num_labels=2, finetuning_task="glue/sst-2")


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory, classifier: Path) -> dict[str, Path]:
    """A model directory per task of the input test."""
    root = tmp_path_factory.mktemp("heads")
    return {"text-classification": classifier, "feature-extraction": classifier,
            "fill-mask": _tiny(root / "mlm", BertForMaskedLM),
            "question-answering": _tiny(root / "qa", BertForQuestionAnswering,
                                        finetuning_task="squad")}


def _bench(capsys: pytest.CaptureFixture, out: Path, *args: str) -> tuple[dict, list[str]]:
    assert main(["bench", "inference", *args, "--output", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"wrote {out}"
    report = json.loads(out.read_text())
    assert lines[:-1] == format_report(report).splitlines()  # the table printed is the file's
    return report, lines[:-1]


def _table(lines: list[str]) -> list[list[str]]:
    """The table rows under the header line, as cells."""
    start = next(i for i, line in enumerate(lines) if line.split(" | ")[0].strip() == "precision")
    rows = []
    for line in lines[start + 1:]:
        if " | " not in line:
            break
        rows.append([cell.strip() for cell in line.split(" | ")])
    return rows


def test_summary_numbers_follow_from_the_timed_calls() -> None:
    """Two replicas: rates are summed, per core divides by the cores, latency percentiles run
    over every call of both (numpy's linear interpolation, written out)."""
    a = Timings(single=[0.1, 0.2, 0.3, 0.4], batches=[1.0, 3.0], batch_size=8, tokens=[32, 32])
    b = Timings(single=[0.5], batches=[2.0], batch_size=8, tokens=[31, 32])
    cell = summarize([a, b], cores=2)
    one, full = cell["batch_1"], cell["saturated"]
    assert one["seq_per_s"] == pytest.approx(4 / 1.0 + 1 / 0.5)
    assert one["seq_per_s_per_core"] == pytest.approx(3.0)
    assert one["calls"] == 5 and full["calls"] == 3
    # sorted latencies 100..500 ms: p50 is the middle one, p99 96% of the way from 400 to 500
    assert one["p50_ms"] == pytest.approx(300.0)
    assert one["p99_ms"] == pytest.approx(400.0 + 0.96 * 100.0)
    assert full["seq_per_s"] == pytest.approx(8 * 2 / 4.0 + 8 * 1 / 2.0)
    assert full["seq_per_s_per_core"] == pytest.approx(4.0)
    assert full["batch_p50_ms"] == pytest.approx(2000.0)
    assert cell["tokens_per_sequence"] == {"min": 31, "max": 32}


@pytest.mark.parametrize("task, length", [("text-classification", 32), ("fill-mask", 24),
                                          ("feature-extraction", 17), ("question-answering", 80)])
def test_inputs_are_exactly_seq_length_tokens(heads: dict[str, Path], task: str,
                                              length: int) -> None:
    settings = BenchSettings(str(heads[task]), task, length, 6, 1.0, 1, 0)
    pipe = load(settings, "fp32")
    requests = bench_requests(pipe, length, 6)
    assert [pipe.cost(r) for r in requests] == [length] * 6  # QA: one window each
    texts = [getattr(r, "context", None) or r.text for r in requests]
    assert len(set(texts)) == 6  # a batch is not one text repeated
    again = bench_requests(pipe, length, 6)
    assert [getattr(r, "context", None) or r.text for r in again] == texts
    assert len(pipe.run(requests)) == 6  # the example item (fill-mask: its mask) survives


def test_report_fields_and_table(classifier: Path, tmp_path: Path, monkeypatch,
                                 capsys: pytest.CaptureFixture) -> None:
    """Default precisions on a CPU with both units (emulated): fp32, bf16, int8; each row's
    agreement is what the pipeline alone reports for that precision."""
    monkeypatch.setenv(EMULATION_VARIABLE, "avx512_bf16,avx512_vnni")
    report, lines = _bench(capsys, tmp_path / "r.json", "--model", str(classifier),
                           "--cores", "1", *FAST)
    assert lines[0] == ("CPU: emulated CPU (avx512_bf16, avx512_vnni; PyTorch kernels "
                        f"{torch.backends.cpu.get_cpu_capability()}, emulated by "
                        f"{EMULATION_VARIABLE}), 1 cores used")
    assert report["task"] == "text-classification" and report["skipped"] == []
    assert report["machine"]["cores_used"] == core_ids()[:1]
    rows = report["results"]
    assert [r["precision"] for r in rows] == ["fp32", "bf16", "int8"]
    assert [r["unit"] for r in rows][1:] == ["avx512_bf16", "avx512_vnni"]
    for row in rows:
        own = load_pipeline(classifier, device="cpu", precision=row["precision"]).precision_choice
        assert (row["choice"], row["agreement"]) == (own.summary(), own.agreement)
        assert (row["replicas"], row["cores"], row["cores_per_replica"]) == (1, 1, 1)
        assert row["batch_1"]["calls"] == 2 and row["saturated"]["calls"] == 2
        assert row["saturated"]["batch_size"] == 4
        assert row["tokens_per_sequence"] == {"min": 32, "max": 32}
        assert row["batch_1"]["p50_ms"] <= row["batch_1"]["p99_ms"]
    table = _table(lines)
    assert [cells[0] for cells in table] == ["fp32", "bf16", "int8"]
    for cells, row in zip(table, rows):
        assert cells[2] == "1 x 1 cores"
        assert float(cells[3]) == pytest.approx(row["batch_1"]["seq_per_s_per_core"], abs=0.05)
        assert float(cells[6]) == pytest.approx(row["saturated"]["seq_per_s_per_core"],
                                                abs=0.05)
        assert cells[8] == ("-" if row["agreement"] is None else f"{row['agreement']:.5f}")


def test_cpu_without_units_measures_fp32_and_says_why(classifier: Path, tmp_path: Path,
                                                      monkeypatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    """Also: a sentence-transformers directory is measured as feature-extraction, and auto is
    resolved and named."""
    monkeypatch.setenv(EMULATION_VARIABLE, "none")
    st = tmp_path / "st"
    export_sentence_transformers(classifier, st)
    report, lines = _bench(capsys, tmp_path / "r.json", "--model", str(st), "--cores", "1",
                           *FAST)
    assert report["task"] == "feature-extraction"
    assert [r["precision"] for r in report["results"]] == ["fp32"]
    assert [s["precision"] for s in report["skipped"]] == ["bf16", "int8"]
    assert lines[-2].startswith("bf16 not measured: no bf16 unit on emulated CPU (no bf16 or "
                                "int8 units;")
    assert lines[-1].endswith("--precision int8 measures it emulated")
    report, lines = _bench(capsys, tmp_path / "r.json", "--model", str(st), "--cores", "1",
                           "--precision", "auto", *FAST)
    (row,) = report["results"]
    assert (row["asked"], row["precision"]) == ("auto", "fp32")
    assert "no bf16 or int8 units" in row["choice"]
    assert _table(lines)[0][0] == "auto -> fp32"


@pytest.mark.slow  # two processes import torch and load the model (~5 s on quiet cores)
@pytest.mark.skipif(len(core_ids()) < 2, reason="two replicas need two cores")
def test_two_replicas_run_pinned_at_once(classifier: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture) -> None:
    report, lines = _bench(capsys, tmp_path / "r.json", "--model", str(classifier),
                           "--cores", "2", "--replicas", "2", "--precision", "fp32", *FAST)
    (row,) = report["results"]
    assert (row["replicas"], row["cores_per_replica"], row["cores"]) == (2, 1, 2)
    assert row["batch_1"]["calls"] == 4 and row["saturated"]["calls"] == 4  # 2 per replica
    assert row["tokens_per_sequence"] == {"min": 32, "max": 32}
    assert _table(lines)[0][2] == "2 x 1 cores"


@pytest.mark.parametrize("args, message", [
    (["--model", "{missing}"], "error: --model {missing} does not exist; give a model directory"),
    (["--model", "{model}", "--cores", "1", "--replicas", "1,3"],
     "error: --replicas: 3 CPU replicas need a core each, but this process may use 1 "
     "(core 0); give --replicas 1 or fewer, or run on more cores"),
    (["--model", "{model}", "--seq-length", "5"],
     "error: --seq-length 5 is shorter than the task's example input"),
    (["--model", "{model}", "--seq-length", "200"],
     "error: --seq-length 200 must be between 3 and the model's 128 positions"),
    (["--model", "{model}", "--cores", "4096"], "error: --cores 4096: this process may run on"),
], ids=["missing-model", "replicas-over-cores", "seq-length-too-short", "seq-length-too-long",
        "cores-over-machine"])
def test_mistakes_are_one_line(classifier: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                               args: list[str], message: str) -> None:
    fill = {"missing": str(tmp_path / "missing"), "model": str(classifier)}
    args = [a.format(**fill) for a in args]
    assert main(["bench", "inference", *args, "--iterations", "1", "--warmup", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message.format(**fill)) and err.count("\n") == 1, err


def test_bad_precision_and_replicas_are_refused_by_the_parser(capsys) -> None:
    for flag, value in (("--precision", "fp32,fp8"), ("--replicas", "1,0")):
        with pytest.raises(SystemExit) as stop:
            main(["bench", "inference", "--model", "m", flag, value])
        assert stop.value.code == 2
        assert f"argument {flag}: expected comma-separated" in capsys.readouterr().err


def test_percentiles_match_numpy_on_many_calls() -> None:
    rng = np.random.default_rng(0)
    calls = list(rng.uniform(0.01, 0.05, size=200))
    cell = summarize([Timings(calls, [1.0], 1, [8])], cores=1)
    assert cell["batch_1"]["p99_ms"] == pytest.approx(float(np.sort(calls)[197] * 1e3 + 0.01 * (
        np.sort(calls)[198] - np.sort(calls)[197]) * 1e3))
