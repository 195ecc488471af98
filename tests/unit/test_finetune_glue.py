"""GLUE readers: the nine task specs, GLUE's original TSV quirks, named-column exports, errors,
and the real files under /work/shared/data/glue when they are there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bertforge.data.finetuning import GLUE_TASKS, LabelMap, glue_task, read_glue
from bertforge.errors import DataError

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "finetune"
SHARED_GLUE = Path(__file__).resolve().parents[3] / "shared" / "data" / "glue"  # ../shared/data


def raises(match: str):
    return pytest.raises(DataError, match=re.escape(match))


def write(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    return path


# --- task specs -----------------------------------------------------------------------------

def test_the_nine_tasks_with_labels_and_metrics() -> None:
    assert list(GLUE_TASKS) == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte",
                                "wnli"]
    assert GLUE_TASKS["mnli"].labels == ("contradiction", "entailment", "neutral")
    assert GLUE_TASKS["rte"].labels == GLUE_TASKS["qnli"].labels == ("entailment",
                                                                      "not_entailment")
    for name in ("cola", "sst2", "mrpc", "qqp", "wnli"):
        assert GLUE_TASKS[name].labels == ("0", "1")
    assert GLUE_TASKS["stsb"].is_regression and GLUE_TASKS["stsb"].labels is None
    assert GLUE_TASKS["cola"].metrics == ("matthews_correlation",)
    assert GLUE_TASKS["mrpc"].metrics == GLUE_TASKS["qqp"].metrics == ("accuracy", "f1")
    assert GLUE_TASKS["stsb"].metrics == ("pearson", "spearmanr")
    for name in ("sst2", "mnli", "qnli", "rte", "wnli"):
        assert GLUE_TASKS[name].metrics == ("accuracy",)
    assert GLUE_TASKS["mrpc"].positive_label == "1"


def test_label_map_keeps_glue_order() -> None:
    labels = glue_task("mnli").label_map()
    assert isinstance(labels, LabelMap) and labels.label2id["neutral"] == 2
    with pytest.raises(ValueError):
        glue_task("stsb").label_map()


@pytest.mark.parametrize("alias,name", [("SST-2", "sst2"), ("sts-b", "stsb"), ("STS_B", "stsb"),
                                        ("mnli-mm", "mnli"), ("MNLI_matched", "mnli"),
                                        ("CoLA", "cola")])
def test_task_aliases(alias: str, name: str) -> None:
    assert glue_task(alias).name == name


def test_unknown_task_lists_tasks_and_suggests() -> None:
    with raises("unknown GLUE task 'mrcp'; did you mean 'mrpc'? the GLUE tasks are cola, sst2, "
                "mrpc, stsb, qqp, mnli, qnli, rte, wnli"):
        glue_task("mrcp")
    with raises("unknown GLUE task 'squad'; the GLUE tasks are"):
        read_glue(ASSETS / "rte.tsv", "squad")


# --- GLUE's original TSVs -------------------------------------------------------------------

def test_cola_without_header_keeps_quotes() -> None:
    examples = read_glue(ASSETS / "cola_raw.tsv", "cola")
    assert [(e.id, e.label, e.text_b) for e in examples] == [("0", "1", None), ("1", "0", None),
                                                             ("2", "1", None)]
    assert examples[0].text_a == 'The cat sat on "the mat.'
    assert examples[0].source == f"{ASSETS / 'cola_raw.tsv'}:1"


def test_cola_test_file_has_a_header() -> None:
    examples = read_glue(ASSETS / "cola_test.tsv", "cola", require_labels=False)
    assert [(e.id, e.text_a, e.label) for e in examples] == [
        ("0", "A sentence to judge.", None), ("1", "Sentence judge to a.", None)]
    with raises(f"{ASSETS / 'cola_test.tsv'}: no label column for cola (looked for label; "
                "found: 'index', 'sentence')"):
        read_glue(ASSETS / "cola_test.tsv", "cola")


def test_sst2() -> None:
    examples = read_glue(ASSETS / "sst2.tsv", "sst-2")
    assert examples[0].text_a == "it 's a charming and often affecting journey . "
    assert [e.label for e in examples] == ["1", "0"]


def test_mrpc_bom_header_and_unbalanced_quotes() -> None:
    examples = read_glue(ASSETS / "mrpc.tsv", "mrpc")
    assert examples[0].text_a == 'He called him "the witness.'
    assert examples[0].text_b == 'As only "the witness", he called him.'
    assert [e.label for e in examples] == ["1", "0"]
    assert examples[1].source == f"{ASSETS / 'mrpc.tsv'}:3"


def test_stsb_ten_columns() -> None:
    examples = read_glue(ASSETS / "stsb.tsv", "stsb")
    assert [(e.id, e.text_b, e.label) for e in examples] == [
        ("0", "An air plane is taking off.", 5.0), ("1", "A dog runs.", 0.25)]


def test_qqp_ids_and_is_duplicate() -> None:
    examples = read_glue(ASSETS / "qqp.tsv", "qqp")
    assert [(e.id, e.label) for e in examples] == [("133273", "1"), ("402555", "0")]
    assert examples[0].text_b == "What is the best way to learn Python?"


def test_mnli_gold_label_is_the_last_column() -> None:
    examples = read_glue(ASSETS / "mnli_dev_matched.tsv", "mnli-m")
    assert [e.label for e in examples] == ["neutral", "contradiction", "entailment"]
    assert examples[2].text_a == "uh i don't know"
    assert examples[1].text_b == "The Government Executive articles are not on the site."


@pytest.mark.parametrize("name,task,labels", [
    ("qnli.tsv", "qnli", ["entailment", "not_entailment"]),
    ("rte.tsv", "rte", ["not_entailment", "entailment"]),
    ("wnli.tsv", "wnli", ["1", "0"]),
])
def test_index_pair_label_files(name: str, task: str, labels: list[str]) -> None:
    examples = read_glue(ASSETS / name, task)
    assert [e.label for e in examples] == labels
    assert [e.id for e in examples] == ["0", "1"] and all(e.text_b for e in examples)


# --- named-column exports -------------------------------------------------------------------

def test_mnli_hf_ints_follow_hugging_face_order() -> None:
    examples = read_glue(ASSETS / "mnli_hf.jsonl", "mnli")
    assert [e.label for e in examples] == ["neutral", "entailment", "contradiction"]
    assert examples[0].text_a == "Conceptually cream skimming has two basic dimensions."
    assert examples[2].id == "2"


def test_qnli_csv_ints_and_quoted_commas() -> None:
    examples = read_glue(ASSETS / "qnli_hf.csv", "qnli")
    assert [(e.id, e.label) for e in examples] == [("7", "entailment"), ("8", "not_entailment")]
    assert examples[1].text_b == 'The "house" is far.'


def test_label_names_and_hugging_face_names() -> None:
    assert [e.label for e in read_glue(ASSETS / "rte_names.csv", "rte")] == [
        "entailment", "not_entailment"]


def test_hf_names_of_binary_tasks(tmp_path: Path) -> None:
    path = write(tmp_path, "c.jsonl", '{"sentence": "a", "label": "acceptable"}\n'
                                      '{"sentence": "b", "label": "unacceptable"}\n')
    assert [e.label for e in read_glue(path, "cola")] == ["1", "0"]
    path = write(tmp_path, "w.jsonl", '{"sentence1": "a", "sentence2": "b", '
                                      '"label": "entailment"}\n')
    assert read_glue(path, "wnli")[0].label == "1"


def test_hf_test_split_minus_one_is_unlabeled() -> None:
    examples = read_glue(ASSETS / "sst2_test_hf.jsonl", "sst2", require_labels=False)
    assert [(e.id, e.label) for e in examples] == [("0", None), ("1", None)]
    with raises(f"{ASSETS / 'sst2_test_hf.jsonl'}:1: no label in column 'label'"):
        read_glue(ASSETS / "sst2_test_hf.jsonl", "sst2")


def test_stsb_export_floats() -> None:
    assert [e.label for e in read_glue(ASSETS / "stsb_hf.jsonl", "stsb")] == [4.8, 0.0]


# --- errors ---------------------------------------------------------------------------------

def test_missing_text_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "d.csv", "text,label\nx,1\n")
    with raises(f"{path}: not a rte file: it needs the text column(s) sentence1+sentence2 or "
                "premise+hypothesis (found: 'text', 'label')"):
        read_glue(path, "rte")


@pytest.mark.parametrize("task,content,line,label", [
    ("rte", "premise,hypothesis,label\na,b,entailment\na,b,maybe\n", 3, "'maybe'"),
    ("mnli", '{"premise": "a", "hypothesis": "b", "label": 3}\n', 1, "3"),
    ("cola", "sentence\tlabel\nx\t2\n", 2, "'2'"),
    ("qnli", "question\tsentence\tlabel\nq\ts\tentailed\n", 2, "'entailed'"),
])
def test_bad_labels_name_the_line(tmp_path: Path, task: str, content: str, line: int,
                                  label: str) -> None:
    suffix = ".jsonl" if content.startswith("{") else ".tsv" if "\t" in content else ".csv"
    path = write(tmp_path, "d" + suffix, content)
    with raises(f"{path}:{line}: label {label} is not a label of GLUE task {task}"):
        read_glue(path, task)


def test_bad_stsb_score(tmp_path: Path) -> None:
    path = write(tmp_path, "s.tsv", "sentence1\tsentence2\tscore\na\tb\tnan\n")
    with raises(f"{path}:2: label 'nan' in column 'score' is not a finite number"):
        read_glue(path, "stsb")


def test_empty_file(tmp_path: Path) -> None:
    path = write(tmp_path, "e.tsv", "")
    with raises(f"{path}: the file is empty"):
        read_glue(path, "cola")


def test_row_with_a_missing_field(tmp_path: Path) -> None:
    path = write(tmp_path, "r.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n"
                                    "1\ta\tentailment\n")
    with raises(f"{path}:3: 3 fields where the header (line 1) has 4 columns"):
        read_glue(path, "rte")


# --- the real files -------------------------------------------------------------------------

def shared(relative: str) -> Path:
    path = SHARED_GLUE / relative
    if not path.is_file():
        pytest.skip(f"{path} is absent (real GLUE data is optional)")
    return path


def test_real_mrpc() -> None:
    examples = read_glue(shared("MRPC/train.tsv"), "mrpc")
    assert len(examples) == 3668
    assert examples[0].text_a.startswith("Amrozi accused his brother, whom he called \"the "
                                         "witness\"")
    assert examples[0].label == "1" and examples[1].label == "0"
    assert examples[-1].source.endswith("MRPC/train.tsv:3669")


def test_real_stsb() -> None:
    examples = read_glue(shared("STS-B/train.tsv"), "sts-b")
    assert len(examples) == 5749
    assert (examples[0].text_a, examples[0].text_b, examples[0].label) == (
        "A plane is taking off.", "An air plane is taking off.", 5.0)
    assert examples[1].label == 3.8 and examples[-1].id == "5748"


def test_real_cola_without_header() -> None:
    examples = read_glue(shared("CoLA/train_raw.tsv"), "cola")
    assert len(examples) == 8551
    assert examples[0].text_a == "Our friends won't buy this analysis, let alone the next one we propose."
    assert examples[0].label == "1"
    assert {e.label for e in examples} == {"0", "1"}


def test_real_rte_superglue_jsonl() -> None:
    examples = read_glue(shared("RTE/train.jsonl"), "rte")
    assert len(examples) == 2490
    assert (examples[0].text_a, examples[0].text_b, examples[0].label) == (
        "No Weapons of Mass Destruction Found in Iraq Yet.",
        "Weapons of Mass Destruction Found in Iraq.", "not_entailment")
    assert examples[1].label == "entailment"
    assert sum(e.label == "entailment" for e in examples) == 1249
