"""A model directory is data from anywhere: the files its metadata names stay inside it, its
sizes are checked against the machine before anything is built, a pickle it holds is refused
with the reason and a way out, and the path options that name it refuse an empty string.

Shard indexes naming files outside the directory (absolute, ``..``, a symbolic link), naming a
config or a pickle, or shaped wrong; a Hugging Face Hub cache snapshot (symbolic links into
``blobs/``) that must keep working; config.json sizes of 10**12; a ``pytorch_model.bin`` holding
a function call; ``--model ""``; continued pretraining of a checkpoint without an NSP head on
sentence-pair data."""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge.cli import main
from bertforge.errors import CheckpointError, ConfigError
from bertforge.models import BertConfig, BertForPreTraining
from bertforge.models.registry import BERT
from bertforge.tokenization import BertTokenizer

from cli_output import one_error_line
from hub_cache import fill_cache

INDEX = "model.safetensors.index.json"
MRPC = Path(__file__).resolve().parents[1] / "assets" / "finetune" / "mrpc.tsv"


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


@pytest.fixture(scope="module")
def tiny_bert(tiny, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny pretrained BERT (MLM + NSP) directory with its tokenizer."""
    tok = BertTokenizer.from_file(tiny.vocab)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    return BertForPreTraining(config).save_pretrained(
        tmp_path_factory.mktemp("model_files") / "bert", tokenizer=tok)


def copy_model(source: Path, target: Path, *, weights: bool = True) -> Path:
    target.mkdir(parents=True)
    for file in source.iterdir():
        if weights or file.name != "model.safetensors":
            (target / file.name).write_bytes(file.read_bytes())
    return target


def shard(source: Path, target: Path) -> dict[str, str]:
    """``target``: ``source`` with its weights in two shards and an index; returns the map."""
    copy_model(source, target, weights=False)
    weights = load_file(source / "model.safetensors")
    names = sorted(weights)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:]), 1):
        file = f"model-0000{i}-of-00002.safetensors"
        save_file({k: weights[k] for k in part}, target / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    write_index(target, weight_map)
    return weight_map


def write_index(directory: Path, weight_map: object) -> None:
    (directory / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def fill_mask(model: str | Path) -> list[str]:
    return ["predict", "fill-mask", "--model", str(model), "--text", "the [MASK]"]


# --- files a shard index names stay inside the model directory --------------------------------


@pytest.mark.parametrize("escape", ["absolute", "dotdot", "symlink"])
def test_a_shard_index_cannot_name_weights_outside_the_model_directory(
        escape: str, tiny_bert: Path, tmp_path: Path, capsys) -> None:
    model = tmp_path / "model"
    weight_map = shard(tiny_bert, model)
    # The same weights, outside the model directory: an index that reaches them must not load.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    moved = outside / "model-00002-of-00002.safetensors"
    (model / moved.name).rename(moved)
    name = {"absolute": str(moved), "dotdot": f"../elsewhere/{moved.name}",
            "symlink": f"linked/{moved.name}"}[escape]
    if escape == "symlink":
        (model / "linked").symlink_to(outside, target_is_directory=True)
    write_index(model, {k: (name if v == moved.name else v) for k, v in weight_map.items()})
    assert exit_code(fill_mask(model)) == 2
    err = one_error_line(capsys)
    assert f"{model / INDEX} (weight_map) names {name!r}" in err, err
    assert "outside" in err or "absolute path" in err, err


@pytest.mark.parametrize("named", ["config.json", "pytorch_model.bin", "vocab.txt",
                                   "weights.SAFETENSORS"])
def test_a_shard_index_naming_a_file_that_is_no_safetensors_file_is_refused(
        named: str, tiny_bert: Path, tmp_path: Path, capsys) -> None:
    """A config, a pickle (which would reach torch.load, also under a suffix spelled in capitals)
    or a text file: none of them is read."""
    model = tmp_path / "model"
    weight_map = shard(tiny_bert, model)
    for pickle_name in ("pytorch_model.bin", "weights.SAFETENSORS"):
        torch.save({"x": torch.zeros(1)}, model / pickle_name)
    first = sorted(set(weight_map.values()))[0]
    write_index(model, {k: (named if v == first else v) for k, v in weight_map.items()})
    assert exit_code(fill_mask(model)) == 2
    err = one_error_line(capsys)
    assert f"{model / INDEX} (weight_map) names {named!r}, which is not a .safetensors file" \
        in err, err


@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "is a JSON list, not an object with a 'weight_map'"),
    ('{"metadata": {}}', "has no 'weight_map' object"),
    ('{"weight_map": ["model-00001-of-00002.safetensors"]}', "has no 'weight_map' object"),
    ('{"weight_map": {"bert.x": 5}}', "weight_map['bert.x'] is 5, not a file name"),
    ('{"weight_map": {"bert.x": ""}}', "names '', not a file name"),
    ('{"weight_map":\n  {"bert.x": "a.safetensors",}}', ":2:30: not valid JSON"),
])
def test_a_shard_index_of_the_wrong_shape_is_one_line_naming_it(
        content: str, message: str, tiny_bert: Path, tmp_path: Path, capsys) -> None:
    model = tmp_path / "model"
    shard(tiny_bert, model)
    (model / INDEX).write_text(content)
    assert exit_code(fill_mask(model)) == 2
    err = one_error_line(capsys)
    assert str(model / INDEX) in err and message in err, err


def test_a_sharded_hub_snapshot_of_links_into_blobs_still_loads(tiny_bert: Path,
                                                                 tmp_path: Path) -> None:
    """huggingface_hub's cache: every file of a snapshot is a link into the repo's blobs/,
    outside the snapshot folder but inside the repo folder, which is allowed."""
    sharded = tmp_path / "sharded"
    shard(tiny_bert, sharded)
    snapshot = fill_cache(Path(os.environ["HF_HUB_CACHE"]), "org/sharded-bert", sharded)
    assert all((snapshot / f.name).is_symlink() for f in sharded.iterdir())
    assert exit_code(fill_mask("org/sharded-bert")) == 0
    # Through the snapshot the index may not reach another repo's blobs.
    other = fill_cache(Path(os.environ["HF_HUB_CACHE"]), "org/other-bert", sharded)
    blob = os.path.relpath(other / "model-00001-of-00002.safetensors", snapshot)
    index = json.loads((snapshot / INDEX).read_text())
    index["weight_map"] = {k: blob for k in index["weight_map"]}
    (snapshot / INDEX).unlink()
    (snapshot / INDEX).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="leads outside"):
        BertForPreTraining.from_pretrained("org/sharded-bert")


@pytest.mark.parametrize("named", ["tokenizer", "shard"])
def test_files_a_prepared_data_manifest_names_stay_inside_it(named: str, tiny, tmp_path: Path,
                                                             capsys) -> None:
    """The same rule for prepared data: its manifest names its shards and its tokenizer."""
    data = shutil.copytree(tiny.data, tmp_path / "data")
    manifest = json.loads((data / "manifest.json").read_text())
    if named == "tokenizer":
        manifest["tokenizer"] = str(tiny.root)  # an absolute folder holding a vocab.txt
    else:  # the same shard, moved out and reached through "..": not to be read
        shard_entry = manifest["splits"]["train"]["shards"][0]
        (tmp_path / "outside").mkdir()
        (data / shard_entry["file"]).rename(tmp_path / "outside" / "shard.safetensors")
        shard_entry["file"] = "../outside/shard.safetensors"
    (data / "manifest.json").write_text(json.dumps(manifest))
    assert exit_code(["inspect", str(data)]) == 2
    assert f"manifest.json ({'tokenizer' if named == 'tokenizer' else 'split train'}) names" \
        in one_error_line(capsys)


def _first_shard(m: dict) -> dict:
    return m["splits"]["train"]["shards"][0]


# (what is wrong, the change to a real manifest, the key the refusal names)
WRONG_MANIFESTS = [
    ("splits a list", lambda m: m.update(splits=[1]), "splits"),
    ("a split a list", lambda m: m["splits"].update(train=[1]), "splits.train"),
    ("shards an object", lambda m: m["splits"]["train"].update(shards={"file": "x"}),
     "splits.train.shards"),
    ("a shard a list", lambda m: m["splits"]["train"].update(
        shards=[["train/shard-00000.safetensors", 29]]), "splits.train.shards[0]"),
    ("a shard file a number", lambda m: _first_shard(m).update(file=5),
     "splits.train.shards[0].file"),
    ("a shard without a count", lambda m: _first_shard(m).pop("instances"),
     "splits.train.shards[0].instances"),
    ("a count as text", lambda m: _first_shard(m).update(instances="29"),
     "splits.train.shards[0].instances"),
    ("a negative count", lambda m: _first_shard(m).update(instances=-1),
     "splits.train.shards[0].instances"),
    ("a histogram row short", lambda m: m["splits"]["train"].update(length_histogram=[[1, 32]]),
     "splits.train.length_histogram[0]"),
    ("special ids a list", lambda m: m.update(special_ids=["pad"]), "special_ids"),
    ("a special id a word", lambda m: m["special_ids"].update(pad="zero"), "special_ids.pad"),
    ("counts a list", lambda m: m.update(counts=[]), "counts"),
    ("vocab size as text", lambda m: m.update(vocab_size="460"), "vocab_size"),
    ("length a bool", lambda m: m.update(max_seq_length=True), "max_seq_length"),
    ("objective a list", lambda m: m.update(objective=["nsp"]), "objective"),
    ("masking as text", lambda m: m.update(masked_lm_prob="0.15"), "masked_lm_prob"),
    ("lower case a number", lambda m: m.update(do_lower_case=1), "do_lower_case"),
    ("version true", lambda m: m.update(format_version=True), "format_version"),
]


@pytest.mark.parametrize("command", ["inspect", "pretrain"])
@pytest.mark.parametrize("case", [w[0] for w in WRONG_MANIFESTS])
def test_a_prepared_data_manifest_of_the_wrong_shape_is_one_line(case: str, command: str, tiny,
                                                                 tiny_args, tmp_path: Path,
                                                                 capsys) -> None:
    """A manifest edited by hand or written by another tool, with a list where an object
    belongs, a number where a name does, text where a count does: every command reading it
    refuses it in one line naming the file and the key, never an AttributeError or TypeError
    from deep inside a reader."""
    _, change, key = next(w for w in WRONG_MANIFESTS if w[0] == case)
    data = shutil.copytree(tiny.data, tmp_path / "data")
    manifest = json.loads((data / "manifest.json").read_text())
    change(manifest)
    (data / "manifest.json").write_text(json.dumps(manifest))
    argv = (["inspect", str(data)] if command == "inspect" else
            ["pretrain", *tiny_args(tmp_path / "run", f"--data.path={data}")])
    assert exit_code(argv) == 2
    err = one_error_line(capsys)
    assert f"{data / 'manifest.json'}: {key} " in err and "bertforge prepare" in err, err
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").glob("checkpoint-*"))


def test_inspect_of_a_manifest_without_a_key_it_shows_is_one_line(tiny, tmp_path: Path,
                                                                  capsys) -> None:
    """inspect shows the masking settings and draws masks with the special ids: a manifest
    without them is refused naming the key; one without the per-split counts it can do without
    (a manifest written by hand, listing only its shards) is shown."""
    data = shutil.copytree(tiny.data, tmp_path / "data")
    manifest = json.loads((data / "manifest.json").read_text())
    for split in manifest["splits"].values():
        for key in ("instances", "tokens", "length_histogram"):
            del split[key]
    (data / "manifest.json").write_text(json.dumps(manifest))
    assert exit_code(["inspect", str(data)]) == 0
    assert "29 instances in 1 shard(s), tokens not recorded" in capsys.readouterr().out
    del manifest["special_ids"]["mask"]
    (data / "manifest.json").write_text(json.dumps(manifest))
    assert exit_code(["inspect", str(data)]) == 2
    assert f"{data / 'manifest.json'}: special_ids.mask is missing" in one_error_line(capsys)


def test_a_sentence_transformers_module_path_stays_inside_the_model(tiny_bert: Path,
                                                                   tmp_path: Path,
                                                                   capsys) -> None:
    from bertforge.export.sentence_transformers import write_sentence_transformers_files

    model = copy_model(tiny_bert, tmp_path / "model")
    write_sentence_transformers_files(model, pooling="cls", normalize=False, dimensions=32,
                                      max_seq_length=64)
    outside = tmp_path / "outside"
    shutil.copytree(model / "1_Pooling", outside)
    modules = json.loads((model / "modules.json").read_text())
    modules[1]["path"] = "../outside"
    (model / "modules.json").write_text(json.dumps(modules))
    assert exit_code(["predict", "embed", "--model", str(model), "--text", "a b"]) == 2
    assert "modules.json (the pooling module's path) names '../outside/config.json'" \
        in one_error_line(capsys)


# --- a pickled weights file: refused with the reason and what to do ---------------------------


class _Call:
    """Unpickled, this would run ``os.system``: a weights-only load must refuse it."""

    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def test_a_pickled_weights_file_is_refused_with_the_reason_and_a_way_out(
        tiny_bert: Path, tmp_path: Path, capsys) -> None:
    import argparse

    model = copy_model(tiny_bert, tmp_path / "model", weights=False)
    weights = dict(load_file(tiny_bert / "model.safetensors"))
    torch.save({**weights, "run": _Call()}, model / "pytorch_model.bin")
    assert exit_code(fill_mask(model)) == 2
    err = one_error_line(capsys)
    # torch's own reason, not its generic advice
    assert "posix.system" in err and "Re-running" not in err, err
    assert "unpickling can run code" in err and "safetensors" in err, err
    # A file holding only harmless objects besides tensors: the command given converts it.
    torch.save({**weights, "args": argparse.Namespace(lr=1e-4)}, model / "pytorch_model.bin")
    assert exit_code(fill_mask(model)) == 2
    err = one_error_line(capsys)
    assert "argparse.Namespace" in err, err
    command = err.split("use that file: ", 1)[1].rsplit("; otherwise", 1)[0]
    argv = shlex.split(command)
    assert argv[0] == "python"
    subprocess.run([sys.executable, *argv[1:]], check=True, timeout=120)
    assert exit_code(fill_mask(model)) == 0


# --- sizes in config.json are checked before anything is built --------------------------------


def huge_model(source: Path, target: Path, key: str) -> Path:
    copy_model(source, target)
    config = json.loads((target / "config.json").read_text())
    config[key] = 10**12
    if config["architectures"] == ["BertForPreTraining"]:
        config["architectures"] = ["BertForMaskedLM"]  # a head export takes
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "max_position_embeddings"])
@pytest.mark.parametrize("command", ["predict", "serve", "export", "finetune", "pipeline",
                                     "from_pretrained"])
def test_a_config_with_impossible_sizes_is_refused_before_anything_is_built(
        command: str, key: str, tiny_bert: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    model = huge_model(tiny_bert, tmp_path / "huge", key)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    started = time.monotonic()
    if command in ("pipeline", "from_pretrained"):
        import bertforge

        with pytest.raises(ConfigError) as caught:
            if command == "pipeline":
                bertforge.pipeline("fill-mask", str(model), device="cpu")
            else:
                BERT.model_class("masked-lm").from_pretrained(model)
        err = str(caught.value)
    else:
        argv = {"predict": fill_mask(model),
                "serve": ["serve", "--model", str(model), "--port", "0"],
                "export": ["export", "onnx", "--model", str(model), "--output",
                           str(tmp_path / "onnx")],
                "finetune": ["finetune", "--task=glue", "--data.task_name=mrpc",
                             f"--model={model}", f"--data.train={MRPC}",
                             f"--output_dir={tmp_path / 'run'}"]}[command]
        assert exit_code(argv) == 2
        err = one_error_line(capsys)
    assert time.monotonic() - started < 60  # refused from the numbers, nothing allocated
    assert f"{key}=1,000,000,000,000" in err and str(model / "config.json") in err, err
    assert "GiB" in err, err
    assert not (tmp_path / "onnx").exists()


def test_a_huge_bart_config_is_refused_by_generate(tiny_bart: Path, tmp_path: Path,
                                                    capsys) -> None:
    model = huge_model(tiny_bart, tmp_path / "bart", "d_model")
    (tmp_path / "in.txt").write_text("a text\n")
    assert exit_code(["generate", "--model", str(model), "--input", str(tmp_path / "in.txt"),
                      "--output", str(tmp_path / "out.jsonl")]) == 2
    assert "d_model=1,000,000,000,000 gives a model of" in one_error_line(capsys)


# --- an empty path option is an error naming it ------------------------------------------------


@pytest.mark.parametrize("argv, option", [
    (["predict", "fill-mask", "--model", "", "--text", "a"], "--model"),
    (["predict", "fill-mask", "--model", "  ", "--text", "a"], "--model"),
    (["serve", "--model", ""], "--model"),
    (["export", "onnx", "--model", "M", "--output", ""], "--output"),
    (["generate", "--model", "M", "--input", "", "--output", "o.jsonl"], "--input"),
    (["prepare", "--input", "c.txt", "--vocab", "v.txt", "--output", ""], "--output"),
    (["vocab", "--input", "", "--output", "v.txt"], "--input"),
    (["inspect", " "], "PATH"),
    (["evaluate", "squad", "--data", "d.json", "--predictions", ""], "--predictions"),
    (["convert", "--checkpoint", "c.pt", "--model-config", "", "--output", "o"],
     "--model-config"),
    (["finetune", "--task=squad", "--model=", "--data.train=t.json"], "--model"),
    (["finetune", "--task=squad", "--model=M", "--data.train= "], "--data.train"),
    (["pretrain", "--output_dir=", "--data.path=d"], "--output_dir"),
    (["pretrain", "--init_from=\t", "--data.path=d"], "--init_from"),
])
def test_an_empty_path_option_is_an_error_naming_it(argv: list[str], option: str,
                                                    tmp_path: Path, capsys,
                                                    monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # an empty path read as "." would use (or write) this folder
    assert exit_code(argv) == 2
    err = one_error_line(capsys)
    assert option in err and ("is empty" in err or "no value" in err), err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("call", ["pipeline", "open_model", "load_tokenizer", "from_pretrained",
                                  "BertTokenizer", "BpeTokenizer", "ModernBpeTokenizer"])
def test_an_empty_path_is_refused_by_the_python_api(call: str, tiny_bert: Path, tmp_path: Path,
                                                    monkeypatch) -> None:
    import bertforge
    from bertforge.models.loading import open_model
    from bertforge.tokenization import load_tokenizer
    from bertforge.tokenization.bpe import BpeTokenizer
    from bertforge.tokenization.modern import ModernBpeTokenizer

    # A model directory as the current folder: an empty path read as "." would load it.
    monkeypatch.chdir(copy_model(tiny_bert, tmp_path / "cwd"))
    functions = {"pipeline": lambda: bertforge.pipeline("fill-mask", ""),
                 "open_model": lambda: open_model(""),
                 "load_tokenizer": lambda: load_tokenizer(" "),
                 "from_pretrained": lambda: BertForPreTraining.from_pretrained(""),
                 "BertTokenizer": lambda: BertTokenizer.from_pretrained(""),
                 "BpeTokenizer": lambda: BpeTokenizer.from_pretrained(""),
                 "ModernBpeTokenizer": lambda: ModernBpeTokenizer.from_file("")}
    with pytest.raises(ConfigError, match="is empty"):
        functions[call]()


# --- continued pretraining on sentence-pair data -----------------------------------------------


@pytest.mark.parametrize("start", ["masked-lm checkpoint", "no architectures", "modernbert"])
def test_continued_pretraining_without_a_pair_head_on_nsp_data_says_prepare_objective_none(
        start: str, tiny, tiny_args, tiny_bert: Path, tmp_path: Path, capsys) -> None:
    if start == "modernbert":
        extra = ["--model=modernbert-tiny"]
    else:
        model = tmp_path / "mlm"
        BERT.model_class("masked-lm").from_pretrained(tiny_bert).save_pretrained(
            model, tokenizer=BertTokenizer.from_pretrained(tiny_bert))
        if start == "no architectures":
            config = json.loads((model / "config.json").read_text())
            del config["architectures"]
            (model / "config.json").write_text(json.dumps(config))
        extra = [f"--init_from={model}"]
    assert exit_code(["pretrain", *tiny_args(tmp_path / "run", *extra)]) == 2
    err = one_error_line(capsys)
    assert "bertforge prepare --objective none" in err and str(tiny.data) in err, err
    assert not list((tmp_path / "run").glob("checkpoint-*"))
