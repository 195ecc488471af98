"""Every JSON file bertforge reads is read the same way, ids key nothing twice, a setting never
changes without a word, and the docs say what the registries support.

JSON: a byte-order mark is accepted, invalid JSON is ``FILE:LINE:COLUMN``, a key given twice in
one object names both places (config.json, generation_config.json, the tokenizer files, a shard
index, the sentence-transformers files, a prepared data manifest, SQuAD predictions and
no-answer scores). Ids: a repeated id in a reader's file, a label name or id given twice in
config.json's label maps, a token (or token id) given twice in a tokenizer file. Settings: a
default capped to the model's positions, a saved generation length or tokenizer length replaced,
said once each."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.models import BertConfig, BertForPreTraining
from bertforge.models.registry import FAMILIES
from bertforge.tasks.registry import TASKS
from bertforge.tokenization import BertTokenizer, load_tokenizer
from cli_output import one_error_line

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"
SQUAD = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
    {"context": "Paris is in France.", "qas": [
        {"id": "q1", "question": "Where is Paris?", "answers": [
            {"text": "France", "answer_start": 12}]},
        {"id": "q2", "question": "What is in France?", "answers": [
            {"text": "Paris", "answer_start": 0}]}]}]}]}


@pytest.fixture(scope="module")
def dirs(tiny, tiny_bart, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Directories whose JSON files the cases below damage (each case copies one first)."""
    from bertforge.export.sentence_transformers import write_sentence_transformers_files
    from bertforge.tokenization.training import train_modern_bpe

    root = tmp_path_factory.mktemp("json_inputs")
    tok = BertTokenizer.from_file(tiny.vocab)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    bert = BertForPreTraining(config).save_pretrained(root / "bert", tokenizer=tok)
    sharded = shutil.copytree(bert, root / "sharded")
    weights = load_file(sharded / "model.safetensors")
    (sharded / "model.safetensors").unlink()
    save_file(weights, sharded / "model-00001-of-00001.safetensors", metadata={"format": "pt"})
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": dict.fromkeys(weights, "model-00001-of-00001.safetensors")}))
    st = shutil.copytree(bert, root / "st")
    write_sentence_transformers_files(st, pooling="mean", normalize=True, dimensions=32,
                                      max_seq_length=64)
    bpe = shutil.copytree(tiny_bart, root / "bpe")
    (bpe / "tokenizer.json").unlink()  # vocab.json + merges.txt
    train_modern_bpe([ASSETS / "tiny_corpus.txt"], 300, root / "modern", progress=False)
    squad = root / "squad"
    squad.mkdir()
    (squad / "dev.json").write_text(json.dumps(SQUAD))
    (squad / "predictions.json").write_text(json.dumps({"q1": "France", "q2": "Paris"}))
    (squad / "null_odds.json").write_text(json.dumps({"q1": -1.0, "q2": -2.0}))
    return {"bert": bert, "sharded": sharded, "st": st, "bart": tiny_bart, "bpe": bpe,
            "modern": root / "modern", "data": tiny.data, "squad": squad}


def _pooling(d: Path) -> Any:
    from bertforge.export.sentence_transformers import read_pooling

    return read_pooling(d)


def _generation(d: Path) -> Any:
    from bertforge.models.generation import GenerationConfig

    return GenerationConfig.load(d)


def _open(d: Path) -> Any:
    from bertforge.models.loading import open_model

    return open_model(d)


def _manifest(d: Path) -> Any:
    from bertforge.data.native import read_manifest

    return read_manifest(d)


def _squad_scores(d: Path) -> Any:
    from bertforge.metrics.squad import evaluate_squad_files

    return evaluate_squad_files(d / "dev.json", d / "predictions.json", d / "null_odds.json")


# (directory, file inside it, how bertforge reads it)
READERS: dict[str, tuple[str, str, Callable[[Path], Any]]] = {
    "config.json": ("bert", "config.json", _open),
    "generation_config.json": ("bart", "generation_config.json", _generation),
    "tokenizer.json (WordPiece)": ("bert", "tokenizer.json", load_tokenizer),
    "tokenizer_config.json": ("bert", "tokenizer_config.json", load_tokenizer),
    "tokenizer.json (BART)": ("bart", "tokenizer.json", load_tokenizer),
    "vocab.json": ("bpe", "vocab.json", load_tokenizer),
    "tokenizer.json (ModernBERT)": ("modern", "tokenizer.json", load_tokenizer),
    "shard index": ("sharded", "model.safetensors.index.json",
                    lambda d: BertForPreTraining.from_pretrained(d)),
    "modules.json": ("st", "modules.json", _pooling),
    "pooling config": ("st", "1_Pooling/config.json", _pooling),
    "manifest.json": ("data", "manifest.json", _manifest),
    "squad dev": ("squad", "dev.json", _squad_scores),
    "squad predictions": ("squad", "predictions.json", _squad_scores),
    "squad no-answer scores": ("squad", "null_odds.json", _squad_scores),
}


def pretty(file: Path) -> list[str]:
    """The file rewritten as indented JSON (keys in their order); its lines."""
    text = json.dumps(json.loads(file.read_text(encoding="utf-8")), indent=2,
                      ensure_ascii=False)
    file.write_text(text, encoding="utf-8")
    return text.split("\n")


def prepare(case: str, dirs: dict[str, Path], tmp_path: Path) -> tuple[Path, Callable[[], Any]]:
    folder, name, read = READERS[case]
    copy = shutil.copytree(dirs[folder], tmp_path / folder)
    return copy / name, lambda: read(copy)


@pytest.mark.parametrize("case", READERS)
def test_every_json_reader_accepts_a_byte_order_mark(case: str, dirs, tmp_path: Path) -> None:
    file, read = prepare(case, dirs, tmp_path)
    pretty(file)
    read()
    file.write_bytes(b"\xef\xbb\xbf" + file.read_bytes())
    read()


@pytest.mark.parametrize("case", READERS)
def test_every_json_reader_names_line_and_column_of_invalid_json(case: str, dirs,
                                                                 tmp_path: Path) -> None:
    file, read = prepare(case, dirs, tmp_path)
    lines = pretty(file)
    bad = '  "x": ,' if lines[0] == "{" else "  !,"
    file.write_text("\n".join([lines[0], bad, *lines[1:]]), encoding="utf-8")
    column = len(bad) if lines[0] == "{" else 3  # at the comma, or at the "!"
    with pytest.raises(UserError, match=rf"^{re.escape(str(file))}:2:{column}: not valid JSON"):
        read()


@pytest.mark.parametrize("case", READERS)
def test_every_json_reader_names_both_places_of_a_repeated_key(case: str, dirs,
                                                               tmp_path: Path) -> None:
    file, read = prepare(case, dirs, tmp_path)
    lines = pretty(file)
    # the first key of the first object, given again just before it
    at, found = next((i, m) for i, line in enumerate(lines)
                     if (m := re.match(r'(\s*)("(?:[^"\\]|\\.)*"):', line)))
    indent, name = found.group(1), json.loads(found.group(2))
    file.write_text("\n".join([*lines[:at], f"{indent}{json.dumps(name)}: null,", *lines[at:]]),
                    encoding="utf-8")
    first, column = at + 1, len(indent) + 1
    with pytest.raises(UserError, match=rf"^{re.escape(str(file))}:{first + 1}:{column}: key "
                                        rf"{re.escape(repr(name))} was already given at line "
                                        rf"{first}, column {column}"):
        read()


# --- ids key nothing twice ---------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("reader, name, content, where", [
    ("glue", "mrpc.tsv", "id\tsentence1\tsentence2\tlabel\n7\ta\tb\t1\n8\tc\td\t0\n7\te\tf\t1\n",
     (4, 2)),
    ("classification", "c.csv", "id,text,label\nx,a,pos\ny,b,neg\nx,c,pos\n", (4, 2)),
    ("swag", "s.csv", "id,sent1,sent2,ending0,ending1,label\na,c,s,e,f,0\na,c,s,e,f,1\n",
     (3, 2)),
    ("tags", "t.jsonl", '{"id": "s1", "tokens": ["a"], "tags": ["O"]}\n'
                        '{"id": "s1", "tokens": ["b"], "tags": ["O"]}\n', (2, 1)),
])
def test_a_repeated_id_in_a_readers_file_names_both_lines(reader: str, name: str, content: str,
                                                          where: tuple[int, int],
                                                          tmp_path: Path) -> None:
    from bertforge.data.finetuning.conll import read_token_tags
    from bertforge.data.finetuning.glue import read_glue
    from bertforge.data.finetuning.swag import read_swag
    from bertforge.data.finetuning.tables import read_classification

    path = write(tmp_path / name, content)
    read = {"glue": lambda: read_glue(path, "mrpc"), "classification":
            lambda: read_classification(path), "swag": lambda: read_swag(path),
            "tags": lambda: read_token_tags(path)}[reader]
    second, first = where
    with pytest.raises(UserError, match=rf"^{re.escape(str(path))}:{second}: id .* was already "
                                        rf"used at {re.escape(str(path))}:{first}"):
        read()


def test_a_repeated_question_id_in_a_squad_dev_file_names_both_places(tmp_path: Path,
                                                                      capsys) -> None:
    dev = json.loads(json.dumps(SQUAD))
    dev["data"][0]["paragraphs"][0]["qas"][1]["id"] = "q1"
    write(tmp_path / "dev.json", json.dumps(dev))
    write(tmp_path / "p.json", json.dumps({"q1": "France"}))
    assert main(["evaluate", "squad", "--data", str(tmp_path / "dev.json"), "--predictions",
                 str(tmp_path / "p.json")]) == 2
    err = one_error_line(capsys)
    assert "qas[1]: question id 'q1' was already used at data[0].paragraphs[0].qas[0]" in err


@pytest.mark.parametrize("labels, message", [
    ({"id2label": {"0": "POS", "1": "POS"}}, "id2label gives the name 'POS' to ids 0 and 1"),
    ({"id2label": {"0": "A", "1": "B"}, "label2id": {"A": 0, "B": 0}},
     "label2id gives id 0 to both 'A' and 'B'"),
    ({"id2label": {"0": "A", "1": "B"}, "label2id": {"A": 1, "B": 0}},
     "id2label gives id 0 the name 'A' but label2id gives 'A' id 1"),
])
def test_a_label_named_twice_in_config_json_is_refused(labels: dict, message: str, dirs,
                                                       tmp_path: Path, capsys) -> None:
    model = shutil.copytree(dirs["bert"], tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    config.update(labels, num_labels=2, architectures=["BertForSequenceClassification"])
    (model / "config.json").write_text(json.dumps(config))
    assert main(["predict", "classify", "--model", str(model), "--text", "a b"]) == 2
    err = one_error_line(capsys)
    assert f"{model / 'config.json'}: {message}" in err, err


@pytest.mark.parametrize("folder, file", [("bert", "tokenizer.json"), ("bpe", "vocab.json"),
                                          ("modern", "tokenizer.json")])
def test_a_token_id_given_twice_names_both_tokens(folder: str, file: str, dirs,
                                                  tmp_path: Path) -> None:
    copy = shutil.copytree(dirs[folder], tmp_path / folder)
    data = json.loads((copy / file).read_text())
    vocab = data["model"]["vocab"] if "model" in data else data
    by_id = {i: token for token, i in vocab.items()}
    vocab[by_id[21]] = 20  # two ordinary tokens
    (copy / file).write_text(json.dumps(data))
    first, second = sorted((by_id[20], by_id[21]), key=list(vocab).index)
    with pytest.raises(UserError, match=re.escape(f"tokens {first!r} and {second!r} both have "
                                                  "id 20")):
        load_tokenizer(copy)


def test_a_token_given_twice_in_a_tokenizer_json_names_both_lines(dirs, tmp_path: Path) -> None:
    copy = shutil.copytree(dirs["bert"], tmp_path / "bert")
    text = (copy / "tokenizer.json").read_text()
    token = json.loads(text)["model"]["vocab"]
    name = next(t for t, i in token.items() if i == 20)
    lines = text.split("\n")
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(json.dumps(name) + ":"))
    lines.insert(at + 1, lines[at].split(":")[0] + ": 21,")
    (copy / "tokenizer.json").write_text("\n".join(lines))
    with pytest.raises(UserError, match=rf":{at + 2}:\d+: key {re.escape(repr(name))} was "
                                        rf"already given at line {at + 1}"):
        load_tokenizer(copy)


# --- a setting never changes without a word, and the word is said once -------------------------


@pytest.fixture
def said_afresh(monkeypatch) -> None:
    """Each change is said once per process: a test that looks for the word starts afresh."""
    from bertforge.core import limits

    monkeypatch.setattr(limits, "_SAID", set(), raising=False)


def test_a_default_summarization_length_capped_to_the_positions_is_said_once(
        tiny_bart: Path, tmp_path: Path, caplog, said_afresh) -> None:
    caplog.set_level(logging.INFO)
    data = ASSETS / "summarization" / "xsum.jsonl"
    argv = ["finetune", "--task=summarization", f"--model={tiny_bart}", f"--data.train={data}",
            f"--data.validation={data}", f"--output_dir={tmp_path / 'run'}",
            "--train.max_steps=2", "--train.global_batch_size=2", "--train.micro_batch_size=2",
            "--eval.batch_size=2", "--data.max_train_examples=2", "--data.max_eval_examples=2"]
    assert main(argv) == 0
    said = [r.getMessage() for r in caplog.records]
    for key, default in (("data.max_target_length", 256), ("data.max_seq_length", 1024)):
        lines = [m for m in said if m.startswith(f"{key}: ")]
        assert lines == [f"{key}: using 64 instead of the default {default} (the model has 64 "
                         "positions)"], said


def test_a_saved_generation_length_beyond_the_positions_is_said_once(
        tiny_bart: Path, tmp_path: Path, caplog, said_afresh) -> None:
    from bertforge.models.generation.texts import settings_for
    from bertforge.models.bart import BartConfig
    from bertforge.models.generation import GenerationConfig

    caplog.set_level(logging.INFO)
    config = BartConfig.load(tiny_bart)
    saved = GenerationConfig.load(tiny_bart).replace(max_length=777)
    for _ in range(3):  # e.g. one server request after another
        assert settings_for(config, saved, {}, source="m").length_limits()[1] == 64
    said = [r.getMessage() for r in caplog.records if "777" in r.getMessage()]
    assert said == ["m: generation max_length: using 64 instead of 777 (outputs of 777 tokens "
                    "would exceed the model's 64 positions)"], said


# transformers' "no limit" (int(1e30), what most Hub tokenizers save) is the normal value: said
# at info level; a value that is no length at all is a warning.
NO_LIMIT = int(1e30)


@pytest.mark.parametrize("saved", [NO_LIMIT, 10**30, 1e30, "512", 0, -1, 2.5, True])
def test_a_saved_tokenizer_length_that_is_no_length_is_replaced_with_a_word(
        saved: object, dirs, tmp_path: Path, caplog, said_afresh) -> None:
    copy = shutil.copytree(dirs["bert"], tmp_path / "bert")
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["model_max_length"] = saved
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    caplog.set_level(logging.INFO)
    assert load_tokenizer(copy).model_max_length == 512
    said = [(r.levelname, r.getMessage()) for r in caplog.records
            if "model_max_length" in r.getMessage()]
    no_limit = saved in (NO_LIMIT, 10**30, 1e30)
    assert said == [("INFO" if no_limit else "WARNING",
                     f"{copy / 'tokenizer_config.json'}: model_max_length: using 512 instead of "
                     f"{saved!r}" + (" (transformers' mark of no limit)" if no_limit
                                     else " (not a length in tokens)"))], said


def test_a_pipeline_input_limit_capped_to_the_positions_is_said_once(dirs, caplog,
                                                                      said_afresh) -> None:
    import bertforge

    caplog.set_level(logging.INFO)
    for _ in range(2):
        assert bertforge.pipeline("fill-mask", str(dirs["bert"]), device="cpu").max_length == 64
    said = [r.getMessage() for r in caplog.records if "max_length" in r.getMessage()]
    assert said == [f"{dirs['bert']}: max_length: using 64 instead of the default 512 (the "
                    "model has 64 positions)"], said


# --- the docs say what the registries support ---------------------------------------------------


def test_the_docs_say_which_families_and_tasks_export_to_onnx() -> None:
    """A family with ONNX-exportable heads is never described as not exportable, and the
    feature-extraction row of the serving table names every family with an encoder."""
    docs = {p.name: p.read_text() for p in (ROOT / "docs").glob("*.md")}
    denial = re.compile(r"(?:ONNX export is not offered|not exported|cannot be exported|no ONNX "
                        r"export)[^.]*", re.IGNORECASE)
    for family in FAMILIES:
        page = f"{family.name.lower()}.md"
        for name, text in docs.items():
            for sentence in re.split(r"(?<=\.)\s", text.replace("\n", " ")):
                if not denial.search(sentence):
                    continue
                about = family.name in sentence or (name == page and "this family" in sentence)
                if about and family.exportable:
                    pytest.fail(f"docs/{name} says {family.name} is not exported, but it "
                                f"exports {', '.join(family.exportable)}: {sentence.strip()}")
    served = {t.name for t in TASKS if t.serving is not None}
    assert "feature-extraction" in served
    row = next(line for line in docs["serving.md"].splitlines()
               if line.startswith("| `feature-extraction`"))
    for family in FAMILIES:
        if "base" in family.heads:
            assert family.name in row, f"the feature-extraction row omits {family.name}: {row}"
