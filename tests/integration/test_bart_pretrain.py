"""BART denoising pretraining end to end on the tiny corpus: byte-level BPE -> `prepare
--objective denoise` -> `pretrain` through the one runner. The loss falls, a stopped and resumed
run equals the straight one bitwise, the loader's batches do not depend on its worker count,
benchmark mode counts encoder-decoder FLOPs, the checkpoint loads in transformers, and
mismatched model/data pairs are refused with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import bertforge.train.loop as loop
from bertforge.config import PretrainConfig, load_config
from bertforge.errors import ConfigError
from bertforge.recipes import resolve_recipe
from bertforge.tasks.denoise import DenoiseTask
from bertforge.commands.train import benchmark_pretraining, pretrain, pretraining_task
from bertforge.train.distributed import DistInfo

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "assets" / "tiny_corpus.txt"
ONE_PROCESS = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
TINY_BART = {"model_type": "bart", "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
             "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
             "decoder_ffn_dim": 64, "max_position_embeddings": 80}


@pytest.fixture(scope="module")
def bart_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from bertforge.data.prepare import prepare
    from bertforge.tokenization.training import train_bpe

    root = tmp_path_factory.mktemp("bart")
    train_bpe([CORPUS], vocab_size=400, output=root / "bpe", min_frequency=1, progress=False)
    prepare([CORPUS], vocab=root / "bpe", output=root / "data", objective="denoise",
            max_seq_length=48, validation_fraction=0.2, workers=1, progress=False)
    model = root / "tiny_bart.json"
    model.write_text(json.dumps(TINY_BART))
    return {"data": root / "data", "model": model, "bpe": root / "bpe"}


def config(bart_data: dict[str, Path], out: Path, *extra: str) -> PretrainConfig:
    return load_config(PretrainConfig, resolve_recipe("debug/bart-tiny-cpu"), [
        f"--model={bart_data['model']}", f"--data.path={bart_data['data']}",
        f"--output_dir={out}", "--train.max_steps=6", "--train.global_batch_size=8",
        "--train.micro_batch_size=4", "--train.log_every=1", "--train.eval_every=0",
        "--train.eval_batches=2", "--checkpoint.every=1000", "--checkpoint.keep=0",
        "--resume=auto", *extra])


def metrics(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("seq_per_s", "tokens_per_s")} for r in rows]


def test_denoising_loss_falls_and_the_checkpoint_is_a_bart(tmp_path, bart_data):
    cfg = config(bart_data, tmp_path, "--train.max_steps=40", "--optim.lr=3e-3",
                 "--optim.warmup=0.1")
    result = pretrain(cfg)
    losses = [r["loss"] for r in metrics(tmp_path) if "loss" in r]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1.0  # clearly learning, not noise
    assert set(result.validation) == {"val_loss", "val_token_acc"}
    ckpt = result.final_checkpoint
    assert json.loads((ckpt / "config.json").read_text())["model_type"] == "bart"
    assert (ckpt / "vocab.json").is_file() and (ckpt / "merges.txt").is_file()

    transformers = pytest.importorskip("transformers")
    from bertforge.models.bart import BartForConditionalGeneration

    hf, info = transformers.BartForConditionalGeneration.from_pretrained(
        ckpt, output_loading_info=True)
    assert not any(info.values())
    ours = BartForConditionalGeneration.from_pretrained(ckpt)
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    ids = tok(["Tokens of a sentence."], return_tensors="pt")["input_ids"]
    dec = torch.tensor([[ours.config.decoder_start_token_id, 0, 5, 9]])
    with torch.no_grad():
        diff = (hf.eval()(input_ids=ids, decoder_input_ids=dec).logits
                - ours(ids, None, dec).logits).abs().max()
    assert diff < 1e-5


def test_stopped_and_resumed_run_equals_the_straight_run(tmp_path, bart_data, stop_after,
                                                         monkeypatch):
    straight = pretrain(config(bart_data, tmp_path / "straight", "--checkpoint.every=3"))
    monkeypatch.setattr(loop, "PreemptionFlag", stop_after(3))
    first = pretrain(config(bart_data, tmp_path / "stopped", "--checkpoint.every=3"))
    assert first.preempted and first.step == 3
    monkeypatch.undo()
    resumed = pretrain(config(bart_data, tmp_path / "stopped", "--checkpoint.every=3"))
    assert resumed.step == 6 and not resumed.preempted
    assert metrics(tmp_path / "straight") == metrics(tmp_path / "stopped")
    from safetensors.torch import load_file

    a = load_file(str(straight.final_checkpoint / "model.safetensors"))
    b = load_file(str(resumed.final_checkpoint / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_batches_do_not_depend_on_the_worker_count(tmp_path, bart_data):
    streams = []
    for workers in (0, 2):
        task = pretraining_task(config(bart_data, tmp_path, f"--data.num_workers={workers}"),
                                ONE_PROCESS)
        assert isinstance(task, DenoiseTask)
        it = iter(task.train)
        streams.append([next(it) for _ in range(6)])
    for a, b in zip(*streams):
        assert a.keys() == b.keys() == {"input_ids", "attention_mask", "decoder_input_ids",
                                        "labels", "token_indices", "cu_seqlens", "max_seqlen",
                                        "min_seqlen"}
        assert all(torch.equal(a[k], b[k]) for k in a)
    # The noise is real: sources differ from their targets.
    batch = streams[0][0]
    assert not torch.equal(batch["input_ids"][:, :8], batch["labels"][:, :8])


def test_benchmark_counts_encoder_decoder_flops(tmp_path, bart_data):
    cfg = config(bart_data, tmp_path, "--benchmark.warmup_steps=1", "--benchmark.steps=2")
    report = benchmark_pretraining(cfg)
    assert report["sequences_per_s"] > 0 and report["tokens_per_s"] > 0
    assert report["model_tflops_per_s"] > 0


def test_model_and_data_families_must_match(tmp_path, bart_data, tiny):
    with pytest.raises(ConfigError, match="not a BART model"):
        pretrain(config(bart_data, tmp_path / "a", "--model=bert-tiny"))
    with pytest.raises(ConfigError, match="is a BART model but the data"):
        pretrain(config(bart_data, tmp_path / "b", f"--data.path={tiny.data}"))


def test_two_ddp_ranks_train_like_one_process_with_accumulation(tmp_path, bart_data, child_env):
    """torchrun with 2 gloo ranks (accumulation 1) against 1 process (accumulation 2), dropout
    off: the same batches and noise, so the losses and weights agree to float rounding."""
    import socket
    import subprocess
    import sys

    from safetensors.torch import load_file

    nodrop = tmp_path / "nodrop.json"
    nodrop.write_text(json.dumps({**TINY_BART, "dropout": 0.0}))
    single = pretrain(config(bart_data, tmp_path / "single", f"--model={nodrop}",
                             "--train.max_steps=3"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--config", str(resolve_recipe("debug/bart-tiny-cpu")), f"--model={nodrop}",
            f"--data.path={bart_data['data']}", f"--output_dir={tmp_path / 'ddp'}",
            "--train.max_steps=3", "--train.global_batch_size=8", "--train.micro_batch_size=4",
            "--train.log_every=1", "--train.eval_batches=2", "--checkpoint.every=1000"]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           "--master_addr=127.0.0.1", f"--master_port={port}", "-m",
                           "bertforge.cli", "pretrain", *args], env=child_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    one = [r for r in metrics(tmp_path / "single") if "loss" in r]
    two = [r for r in metrics(tmp_path / "ddp") if "loss" in r]
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2, 3]
    for a, b in zip(one, two):
        for key in ("loss", "token_acc", "grad_norm", "lr"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (a["step"], key)
    wa = load_file(str(single.final_checkpoint / "model.safetensors"))
    wb = load_file(str(tmp_path / "ddp" / "checkpoint-3" / "model.safetensors"))
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-5, atol=1e-6, msg=name)


def test_inspect_shows_noised_pairs_and_noise_statistics(bart_data):
    from bertforge.data.inspect import inspect_dataset

    text = inspect_dataset(bart_data["data"], num=2, seed=3)
    assert "objective denoise" in text and "noise      drawn at load time" in text
    assert text.count("  original <s>") == 2 and text.count("  noised   <s>") == 2
    assert "<mask>" in text
    stats = dict(line.split() for line in text.split("noise statistics over")[1].splitlines()[1:])
    assert 0.5 < float(stats["length_ratio"]) < 1.0   # spans collapse to one <mask> each
    assert 0.0 < float(stats["missing_fraction"]) < 0.6
    assert text == inspect_dataset(bart_data["data"], num=2, seed=3)  # the same draw again


def test_cli_user_errors_for_bart_commands(tmp_path, bart_data, capsys):
    from bertforge.cli import main

    assert main(["vocab", "--type", "bpe", "--cased", "--input", str(CORPUS),
                 "--output", str(tmp_path / "bpe")]) == 2
    assert "byte-level BPE (--type bpe) always keeps case" in capsys.readouterr().err
    assert main(["evaluate", "summarization", "--predictions", str(CORPUS)]) == 2
    assert "needs --references" in capsys.readouterr().err
    assert main(["prepare", "--input", str(CORPUS), "--vocab", str(bart_data["bpe"]),
                 "--output", str(tmp_path / "h5"), "--objective", "denoise",
                 "--format", "hdf5"]) == 2
    assert "cannot hold --objective denoise" in capsys.readouterr().err
    assert main(["pretrain", "--config", "bart-tiny-cpu", f"--data.path={bart_data['data']}",
                 f"--output_dir={tmp_path / 'run'}", "--data.noise.replace_length=2"]) == 2
    assert "data.noise.replace_length=2 must be" in capsys.readouterr().err
