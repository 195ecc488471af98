"""One configuration style for every command: every flag that existed before the command line was
generated from the configs parses to the same value, YAML < command line, did-you-mean for
unknown keys, old names accepted with a note, the resolved config saved beside the outputs, and
a parser built without importing torch."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.cli import main, resolve
from bertforge.commands import COMMANDS
from bertforge.config import GenerationOptions, load_config
from bertforge.core.schema import REQUIRED, closest_key, default_of
from bertforge.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "assets" / "tiny_corpus.txt"

# (command line, {attribute of the resolved config (or "options.NAME"): value}): each flag of
# each command as it was spelled before the parser was generated from the configs.
OLD_FLAGS = [
    ("vocab --input a b c --output v.txt", {"input": ["a", "b", "c"], "output": "v.txt",
                                            "vocab_size": 30522, "type": "wordpiece",
                                            "cased": False, "min_frequency": 2}),
    ("vocab --input a --output o --type bpe --vocab-size 50265 --min-frequency 3 "
     "--text-field body --input-format jsonl", {"type": "bpe", "vocab_size": 50265,
                                                "min_frequency": 3, "text_field": "body",
                                                "input_format": "jsonl"}),
    ("vocab --input a --output o --cased", {"cased": True}),
    ("vocab --input a --output o --type modernbert --vocab-size 50368", {
        "type": "modernbert", "vocab_size": 50368}),
    ("prepare --input a b --vocab v.txt --output d", {
        "input": ["a", "b"], "vocab": "v.txt", "output": "d", "max_seq_length": 128,
        "max_predictions": 20, "masked_lm_prob": 0.15, "short_seq_prob": 0.1, "objective": "nsp",
        "whole_word_masking": False, "dupe_factor": 5, "validation_fraction": 0.01,
        "workers": 1, "seed": 12345, "format": "native", "overwrite": False,
        "input_format": "auto", "text_field": "text"}),
    ("prepare --input a --vocab v --output d --max-seq-length 512 --max-predictions 80 "
     "--masked-lm-prob 0.2 --short-seq-prob 0.05 --objective sop --whole-word-masking "
     "--dupe-factor 2 --validation-fraction 0 --workers 2 --seed 7 --format hdf5 --overwrite "
     "--input-format sentences --text-field body", {
         "max_seq_length": 512, "max_predictions": 80, "masked_lm_prob": 0.2,
         "short_seq_prob": 0.05, "objective": "sop", "whole_word_masking": True,
         "dupe_factor": 2, "validation_fraction": 0.0, "workers": 2, "seed": 7,
         "format": "hdf5", "overwrite": True, "input_format": "sentences",
         "text_field": "body"}),
    ("prepare --input hf://acme/web --vocab v --output d --part 1/4", {
        "input": ["hf://acme/web"], "part": "1/4", "merge": False}),
    ("prepare --input a --vocab v --output d --merge", {"part": None, "merge": True}),
    ("inspect data/phase1", {"path": "data/phase1", "num": 3, "seed": 0}),
    ("inspect data/phase1 --num 2 --seed 5", {"num": 2, "seed": 5}),
    ("convert --checkpoint c.pt --config bert_config.json --output hf", {
        "checkpoint": "c.pt", "model_config": "bert_config.json", "output": "hf",
        "vocab": None, "trust_pickle": False}),
    ("convert --checkpoint c.pt --config bert-base-uncased --output hf --vocab v.txt "
     "--trust-pickle", {"model_config": "bert-base-uncased", "vocab": "v.txt",
                        "trust_pickle": True}),
    ("pretrain --config tiny-cpu --train.max_steps=7", {"train.max_steps": 7,
                                                         "options.benchmark": False}),
    ("pretrain --config debug/tiny-cpu --benchmark", {"options.benchmark": True}),
    ("finetune --config squad-v1.1-bert-base --model=m --seeds 1,2,3", {
        "task": "squad", "options.seeds": [1, 2, 3], "options.benchmark": False}),
    ("finetune --model=m --benchmark --eval.num_beams=4 --eval.early_stopping=true",
     {"options.benchmark": True, "eval.num_beams": 4, "eval.early_stopping": True}),
    ("evaluate squad --data dev.json --predictions p.json --na-probs n.json", {
        "what": "squad", "data": "dev.json", "predictions": "p.json", "na_probs": "n.json"}),
    ("evaluate summarization --predictions p.jsonl --references r.jsonl --prediction-field s "
     "--reference-field t", {"what": "summarization", "references": "r.jsonl",
                             "prediction_field": "s", "reference_field": "t"}),
    ("evaluate retrieval --model m --data beir", {
        "what": "retrieval", "model": "m", "data": "beir", "predictions": None, "split": "test",
        "batch_size": 64, "block_size": 16384, "reranker": None, "rerank_top": 100,
        "device": "auto", "output": None}),
    ("evaluate retrieval --model m --data b --split dev --batch-size 8 --block-size 100 "
     "--reranker r --rerank-top 20 --device cpu --output o.json", {
         "split": "dev", "batch_size": 8, "block_size": 100, "reranker": "r", "rerank_top": 20,
         "device": "cpu", "output": "o.json"}),
    ("evaluate sts --model m --data sts.tsv", {"what": "sts", "model": "m", "data": "sts.tsv"}),
    ("mine --model m --data p.jsonl --output o.jsonl", {
        "model": "m", "data": "p.jsonl", "output": "o.jsonl", "corpus": None, "overwrite": False,
        "range_min": 10, "range_max": 100, "negatives": 5, "margin": None, "batch_size": 64,
        "block_size": 16384, "device": "auto"}),
    ("mine --model m --data p --output o --corpus c.txt --overwrite --range-min 0 --range-max 50 "
     "--negatives 3 --margin 0.05 --batch-size 16 --block-size 1000 --device cpu", {
         "corpus": "c.txt", "overwrite": True, "range_min": 0, "range_max": 50, "negatives": 3,
         "margin": 0.05, "batch_size": 16, "block_size": 1000, "device": "cpu"}),
    ("generate --model m --input i.jsonl --output o.jsonl", {
        "model": "m", "input": "i.jsonl", "output": "o.jsonl", "text_field": None,
        "batch_size": 8, "device": "auto", "max_source_length": None, "num_beams": None,
        "early_stopping": None}),
    ("generate --model m --input i --output o --text-field t --batch-size 4 --device cpu "
     "--max-source-length 100 --num-beams 2 --length-penalty 2.0 --max-length 50 "
     "--min-length 5 --no-repeat-ngram-size 3 --early-stopping never", {
         "text_field": "t", "batch_size": 4, "device": "cpu", "max_source_length": 100,
         "num_beams": 2, "length_penalty": 2.0, "max_length": 50, "min_length": 5,
         "no_repeat_ngram_size": 3, "early_stopping": "never"}),
    ("generate --model m --input i --output o --early-stopping false", {
        "early_stopping": False}),
    ("predict --model m --data d.json --output o.json --eval.batch_size=128", {
        "mode": None, "data": "d.json", "output": "o.json",
        "finetune_overrides": ["--eval.batch_size=128"]}),
    ("predict qa --model m --question q --context c --json --device cpu --precision bf16 "
     "--max-seq-length 64 --truncation truncate --doc-stride 32 --max-query-length 16", {
         "mode": "qa", "question": "q", "context": "c", "json": True, "device": "cpu",
         "precision": "bf16", "max_seq_length": 64, "truncation": "truncate",
         "doc_stride": 32, "max_query_length": 16}),
    ("predict qa --model m --context-file f.txt", {"context_file": "f.txt", "json": False,
                                                   "precision": "auto", "device": "auto"}),
    ("predict classify --model m --text a --text b", {"mode": "classify", "text": ["a", "b"]}),
    ("predict fill-mask --model m --top-k 2", {"top_k": 2}),
    ("predict embed --model m --pooling cls", {"pooling": "cls"}),
    ("predict summarize --model m --num-beams 2 --max-length 30 --min-length 5 "
     "--length-penalty 1.5 --no-repeat-ngram-size 3", {
         "num_beams": 2, "max_length": 30, "min_length": 5, "length_penalty": 1.5,
         "no_repeat_ngram_size": 3}),
    ("serve --model m", {"host": "127.0.0.1", "port": 8000, "task": None, "backend": "torch",
                         "api_key": None, "max_batch_tokens": 8192, "max_wait_ms": 5.0,
                         "max_batch_items": 32, "max_body_bytes": 1 << 20,
                         "max_text_chars": 100_000, "truncation": None, "device": "auto",
                         "no_embeddings": False, "log_level": "info", "replicas": None,
                         "model_threads": 0}),
    ("serve --model m --host 0.0.0.0 --port 0 --task fill-mask --backend onnx-int8 "
     "--api-key k --max-batch-tokens 100 --max-wait-ms 2.5 --max-batch-items 4 "
     "--max-body-bytes 1000 --max-text-chars 50 --truncation truncate --device cpu "
     "--no-embeddings --log-level debug --replicas 2 --model-threads 3", {
         "host": "0.0.0.0", "port": 0, "task": "fill-mask", "backend": "onnx-int8",
         "api_key": "k", "max_batch_tokens": 100, "max_wait_ms": 2.5, "max_batch_items": 4,
         "max_body_bytes": 1000, "max_text_chars": 50, "truncation": "truncate",
         "device": "cpu", "no_embeddings": True, "log_level": "debug", "replicas": "2",
         "model_threads": 3}),
    ("serve --model m --max-json-depth 4 --max-number-digits 20 --max-num-beams 2 "
     "--max-generation-length 64 --max-generation-tokens 512 --header-timeout 1.5 "
     "--body-timeout 2.5 --keep-alive-timeout 0.5", {
         "max_json_depth": 4, "max_number_digits": 20, "max_num_beams": 2,
         "max_generation_length": 64, "max_generation_tokens": 512, "header_timeout": 1.5,
         "body_timeout": 2.5, "keep_alive_timeout": 0.5}),
    ("serve --model m --replica-timeout 30 --replica-restarts 2 --expose-paths", {
        "replica_timeout": 30.0, "replica_restarts": 2, "expose_paths": True}),
    ("serve --model m", {"replica_timeout": 0.0, "replica_restarts": 5, "expose_paths": False}),
    ("serve --model m --max-queue 64 --drain-timeout 5", {"max_queue": 64,
                                                          "drain_timeout": 5.0}),
    ("serve --model m", {"max_queue": 0, "drain_timeout": 20.0}),
    ("export onnx --model m --output o", {"what": "onnx", "opset": 17, "quantize": None,
                                          "sample": None, "triton": False, "atol": 1e-4,
                                          "exporter": "auto"}),
    ("export onnx --model m --output o --opset 14 --quantize int8 --sample s.tsv --triton "
     "--atol 0.001 --exporter torchscript", {
         "opset": 14, "quantize": "int8", "sample": "s.tsv", "triton": True, "atol": 1e-3,
         "exporter": "torchscript"}),
    ("export sentence-transformers --model m --output o", {
        "what": "sentence-transformers", "pooling": None, "normalize": False}),
    ("export sentence-transformers --model m --output o --pooling cls --normalize", {
        "pooling": "cls", "normalize": True}),
    ("bench inference --model m", {"what": "inference", "task": None, "precision": None,
                                   "seq_length": 128, "batch_size": 32, "cores": None,
                                   "replicas": [1], "seconds": 3.0, "iterations": None,
                                   "warmup": 3, "output": None}),
    ("bench inference --model m --task fill-mask --precision fp32,int8 --seq-length 64 "
     "--batch-size 8 --cores 2 --replicas 1,2 --seconds 1.5 --iterations 4 --warmup 0 "
     "--output r.json", {"task": "fill-mask", "precision": ["fp32", "int8"], "seq_length": 64,
                         "batch_size": 8, "cores": 2, "replicas": [1, 2], "seconds": 1.5,
                         "iterations": 4, "warmup": 0, "output": "r.json"}),
    ("plan", {"model": "bert-large-uncased", "max_seq_length": 128, "gpus": 8,
              "gpu_memory": 80.0, "global_batch_size": 65536, "precision": "bf16"}),
    ("plan --model bert-base-uncased --seq-len 512 --gpus 4 --gpu-memory 40 "
     "--global-batch-size 1024 --precision fp16", {
         "model": "bert-base-uncased", "max_seq_length": 512, "gpus": 4, "gpu_memory": 40.0,
         "global_batch_size": 1024, "precision": "fp16"}),
    ("demo", {"workdir": "build/demo", "steps": 300, "bart_steps": 300}),
    ("-v demo --workdir w --steps 10 --bart-steps 5", {"workdir": "w", "steps": 10,
                                                       "bart_steps": 5}),
]


def value(cfg: object, options: object, key: str) -> object:
    obj, parts = (options, key.split(".")[1:]) if key.startswith("options.") else (
        cfg, key.split("."))
    for part in parts:
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("argv, expected", OLD_FLAGS, ids=[a for a, _ in OLD_FLAGS])
def test_every_old_flag_parses_to_the_same_value(argv: str, expected: dict) -> None:
    command, cfg, options = resolve(argv.split())
    for key, want in expected.items():
        got = value(cfg, options, key)
        assert got == want and type(got) is type(want), (key, got, want)


def test_the_table_covers_every_flag_of_every_command() -> None:
    """Each option of each command appears in OLD_FLAGS (so a new flag gets a row too)."""
    seen = " ".join(argv for argv, _ in OLD_FLAGS)
    for command in COMMANDS:
        if not command.flat:
            continue
        for f in dataclasses.fields(command.config):
            meta = f.metadata
            if meta.get("positional") or not meta.get("cli", True):
                continue
            flag = "--" + f.name.replace("_", "-")
            new = f.name in ("docs_per_shard", "chunk_bytes", "length_bin_width", "vocab")
            assert flag in seen or new or meta.get("aliases"), (command.name, flag)


def test_choices_error_as_before(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["evaluate", "bleu", "--predictions", "p"])
    assert stop.value.code == 2
    assert ("argument what: invalid choice: 'bleu' (choose from 'squad', 'summarization', "
            "'finetuned', 'retrieval', 'sts')"
            in capsys.readouterr().err)
    with pytest.raises(SystemExit):
        main(["vocab", "--input", "a", "--output", "o", "--type", "sentencepiece"])
    assert "argument --type: invalid choice: 'sentencepiece'" in capsys.readouterr().err


def test_yaml_then_command_line(tmp_path: Path) -> None:
    recipe = tmp_path / "vocab.yaml"
    recipe.write_text(f"input: [{CORPUS}]\noutput: {tmp_path}/a.txt\nvocab_size: 100\n"
                      "min_frequency: 3\ncased: true\n")
    _, cfg, _ = resolve(["vocab", "--config", str(recipe), "--vocab-size", "200",
                         "--min_frequency=4", "--cased=false"])
    assert (cfg.vocab_size, cfg.min_frequency, cfg.cased) == (200, 4, False)  # command line wins
    assert cfg.output == f"{tmp_path}/a.txt" and cfg.input == [str(CORPUS)]  # from the file
    assert cfg.type == "wordpiece"  # the default where neither says
    # The later of a flag and a --key=value setting of one key wins.
    _, cfg, _ = resolve(["vocab", "--config", str(recipe), "--vocab-size", "200",
                         "--vocab_size=300"])
    assert cfg.vocab_size == 300


@pytest.mark.parametrize("argv, message", [
    (["pretrain", "--train.lr=1e-3"], "unknown config key 'train.lr' in the command line. "
                                      "Did you mean 'optim.lr'?"),
    (["finetune", "--eval.beams=4"], "unknown config key 'eval.beams' in the command line. "
                                     "Did you mean 'eval.num_beams'?"),
    (["pretrain", "--benchmarks"], "unknown option '--benchmarks' of `bertforge pretrain`. "
                                   "Did you mean '--benchmark'?"),
    (["vocab", "--vocab-sise", "9"], "unknown option '--vocab-sise' of `bertforge vocab`. "
                                     "Did you mean '--vocab-size'?"),
    (["vocab", "--vocab_sise=9"], "unknown config key 'vocab_sise' in the command line. "
                                  "Did you mean 'vocab_size'?"),
    (["plan", "--train.max_steps=3"], "unknown config key 'train' in the command line"),
    (["vocab", "--output", "v.txt"], "config key 'input' must be set: give --input"),
    (["vocab", "--input", "a", "--output", "o", "--type", "bpe", "--cased"],
     "--cased applies to WordPiece only"),
    (["generate", "--model", "m", "--input", "i", "--output", "o", "--num-beams", "0"],
     "generation setting num_beams=0 is invalid: must be >= 1"),
    (["finetune", "--eval.min_length=60", "--eval.max_length=20"],
     "generation setting eval.min_length=60 is invalid"),
])
def test_mistakes_are_one_error_line_with_status_2(argv: list[str], message: str,
                                                   capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {message}"), err


def test_closest_key_searches_the_last_names_too() -> None:
    from bertforge.config import FinetuneConfig, PretrainConfig

    assert closest_key(PretrainConfig, "train.lr") == "optim.lr"
    assert closest_key(PretrainConfig, "max_steps") == "train.max_steps"
    assert closest_key(PretrainConfig, "train.max_step") == "train.max_steps"
    assert closest_key(PretrainConfig, "trian") == "train"
    assert closest_key(FinetuneConfig, "data.num_beams") == "eval.num_beams"


def test_renamed_options_still_work_with_a_note(capsys, tmp_path: Path) -> None:
    _, cfg, _ = resolve(["plan", "--seq-len", "256"])
    assert cfg.max_seq_length == 256
    assert capsys.readouterr().err == ("note: --seq-len is deprecated and will be removed; use "
                                       "--max-seq-length\n")
    _, cfg, _ = resolve(["plan", "--seq_len=384"])
    assert cfg.max_seq_length == 384 and "deprecated" in capsys.readouterr().err
    old_yaml = tmp_path / "plan.yaml"
    old_yaml.write_text("seq_len: 64\n")
    _, cfg, _ = resolve(["plan", "--config", str(old_yaml)])
    assert cfg.max_seq_length == 64 and f"(in {old_yaml})" in capsys.readouterr().err
    # convert's --config named the model config; a YAML file is the settings file now.
    _, cfg, _ = resolve(["convert", "--checkpoint", "c.pt", "--config", "bert_config.json",
                         "--output", "o"])
    assert cfg.model_config == "bert_config.json"
    assert "use --model-config" in capsys.readouterr().err
    settings = tmp_path / "convert.yaml"
    settings.write_text("checkpoint: c.pt\nmodel_config: bert-tiny\noutput: o\n")
    _, cfg, _ = resolve(["convert", "--config", str(settings)])
    assert cfg.model_config == "bert-tiny" and capsys.readouterr().err == ""


def help_text(command: str, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "2000")  # argparse wraps at hyphens too
    with pytest.raises(SystemExit) as stop:
        main([command, "--help"])
    assert stop.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # unwrapped


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.flat], ids=lambda c: c.name)
def test_help_lists_every_option_with_its_default(command, capsys, monkeypatch) -> None:
    text = help_text(command.name, capsys, monkeypatch)
    assert "--config FILE.yaml" in text and "--key=value" in text
    for f in dataclasses.fields(command.config):
        if f.metadata.get("positional") or not f.metadata.get("cli", True):
            continue
        flag = "--" + f.name.replace("_", "-")
        default = default_of(f)
        shown = "(required)" if default == REQUIRED else f"(default: {default})"
        if default is None and "default" in f.metadata["help"].lower():
            # The help says what unset means: said once, without a "(default: None)" after it.
            block = text.split(f" {flag} ")[-1].split(" --")[0]  # (the text is unwrapped)
            assert "(default: None)" not in block, flag
            continue
        assert flag in text and shown in text, (flag, shown)
    if command.saves:
        assert "The resolved config is saved" in text


def test_building_the_parser_does_not_import_torch() -> None:
    code = ("import sys, bertforge.cli as cli; cli.build_parser(); "
            "cli.resolve(['vocab', '--input', 'a', '--output', 'b']); "
            "print('torch' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.split() == ["False", "False"]


def test_fixed_choices_match_their_sources() -> None:
    """The parser's copies of facts whose modules are too heavy to import at parse time."""
    from bertforge.commands.serve import DEFAULT_ATOL
    from bertforge.data import native_writer
    from bertforge.data.prepare_config import PrepareConfig
    from bertforge.export.onnx import DEFAULT_ATOL as EXPORT_ATOL

    assert PrepareConfig.__dataclass_fields__["length_bin_width"].default == (
        native_writer.DEFAULT_BIN_WIDTH)
    assert DEFAULT_ATOL == EXPORT_ATOL


def test_generation_options_are_defined_once() -> None:
    from bertforge.commands.generate import GenerateConfig
    from bertforge.commands.predict import PredictConfig
    from bertforge.config import EvalConfig
    from bertforge.inference.pipelines.summarize import _GENERATION_FIELDS

    names = GenerationOptions.setting_names()
    for cls in (EvalConfig, GenerateConfig, PredictConfig):
        assert issubclass(cls, GenerationOptions)
    assert tuple(_GENERATION_FIELDS) == names
    assert _GENERATION_FIELDS["num_beams"] is int and _GENERATION_FIELDS["length_penalty"] is float
    with pytest.raises(ConfigError, match="max_length=1 is invalid: must be >= 2"):
        load_config(GenerateConfig, None, ["--model=m", "--input=i", "--output=o",
                                           "--max_length=1"])


# --- the resolved config beside the outputs ----------------------------------------------------


def test_vocab_saves_its_config_beside_the_vocabulary(tmp_path: Path) -> None:
    out = tmp_path / "wp" / "vocab.txt"
    assert main(["vocab", "--input", str(CORPUS), "--output", str(out), "--vocab-size",
                 "150"]) == 0
    saved = out.with_name("vocab.txt.config.yaml")
    assert load_config(type(resolve(["vocab", "--input", "a", "--output", "b"])[1]),
                       saved).vocab_size == 150
    # Run again from the saved file alone: the same vocabulary.
    again = tmp_path / "again" / "vocab.txt"
    assert main(["vocab", "--config", str(saved), "--output", str(again)]) == 0
    assert again.read_text() == out.read_text()
    assert main(["vocab", "--type", "bpe", "--input", str(CORPUS), "--output",
                 str(tmp_path / "bpe"), "--vocab-size", "300"]) == 0
    assert "type: bpe" in (tmp_path / "bpe" / "vocab-config.yaml").read_text()


def test_a_refused_command_saves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "v.txt"
    assert main(["vocab", "--input", str(tmp_path / "missing.txt"), "--output", str(out)]) == 2
    assert list(tmp_path.iterdir()) == []


def test_prepare_saves_its_config_in_the_output(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    assert main(["vocab", "--input", str(CORPUS), "--output", str(vocab), "--vocab-size",
                 "150"]) == 0
    out = tmp_path / "data"
    args = ["--input", str(CORPUS), "--vocab", str(vocab), "--max-seq-length", "32",
            "--validation-fraction", "0"]
    assert main(["prepare", *args, "--output", str(out)]) == 0
    text = (out / "config.yaml").read_text()
    assert "output: ???" in text and "max_seq_length: 32" in text
    assert (out / "prepare-settings.json").is_file()
    with pytest.raises(ConfigError, match="'output' must be set"):
        load_config(type(resolve(["prepare", *args, "--output", "x"])[1]), out / "config.yaml")
    # The saved file and a new --output prepare the same data again.
    assert main(["prepare", "--config", str(out / "config.yaml"), "--output",
                 str(tmp_path / "again")]) == 0
    assert (json.loads((tmp_path / "again" / "manifest.json").read_text())["counts"]
            == json.loads((out / "manifest.json").read_text())["counts"])


def test_generate_saves_its_config_beside_the_output(tiny_bart: Path, tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("the first text\nthe second text\n")
    out = tmp_path / "out" / "summaries.jsonl"
    assert main(["generate", "--model", str(tiny_bart), "--input", str(texts), "--output",
                 str(out), "--num-beams", "2", "--early-stopping", "true", "--device",
                 "cpu"]) == 0
    assert len(out.read_text().splitlines()) == 2
    saved = (tmp_path / "out" / "summaries.jsonl.config.yaml").read_text()
    assert "num_beams: 2" in saved and "early_stopping: true" in saved


def test_export_saves_its_config_in_the_output(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    import torch

    from bertforge.models import BertConfig, BertForSequenceClassification
    from bertforge.tokenization import BertTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"]
    torch.manual_seed(0)
    config = BertConfig.from_preset("bert-tiny", vocab_size=len(vocab),
                                    max_position_embeddings=32, num_labels=2,
                                    finetuning_task="classification")
    model_dir = BertForSequenceClassification(config).save_pretrained(
        tmp_path / "model", tokenizer=BertTokenizer(vocab))
    out = tmp_path / "export"
    assert main(["export", "onnx", "--model", str(model_dir), "--output", str(out),
                 "--opset", "17"]) == 0
    saved = (out / "export-config.yaml").read_text()
    assert "what: onnx" in saved and f"output: {out}" in saved


def test_server_requests_take_the_same_generation_options(tiny_bart: Path) -> None:
    from bertforge.inference.pipelines import InputError, load_pipeline

    pipe = load_pipeline(tiny_bart, device="cpu")
    request = pipe.parse({"text": "a text", "num_beams": 2, "early_stopping": "never"})
    assert (request.settings.num_beams, request.settings.early_stopping) == (2, "never")
    assert pipe([request])[0]["summary"] is not None
    with pytest.raises(InputError) as caught:
        pipe.parse({"text": "a text", "early_stopping": "maybe"})
    assert caught.value.field == "early_stopping" and '"never"' in caught.value.message


def test_every_command_line_of_the_readme_parses(capsys) -> None:
    import shlex

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The command line"):]
    start = section.index("```\n") + 4
    lines = [ln.split("  # ")[0].strip() for ln in section[start:section.index("```", start)]
             .splitlines()]
    commands = [shlex.split(ln)[1:] for ln in lines if ln.startswith("bertforge")]
    assert {argv[0] for argv in commands} == {c.name for c in COMMANDS}
    for argv in commands:
        resolve(argv)
    assert "deprecated" not in capsys.readouterr().err  # the README uses the current names
