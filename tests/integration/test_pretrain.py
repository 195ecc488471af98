"""`pretrain` end to end on the tiny data: golden losses of the debug recipe, the outputs of a
finished run, benchmark mode and the user errors that surface through `pretrain`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import bertforge.train.run as run_module
from bertforge.config import PretrainConfig, load_config
from bertforge.errors import ConfigError, DataError
from bertforge.models import BertForPreTraining
from bertforge.train.data import open_pretrain_data
from bertforge.train.distributed import DistInfo
from bertforge.commands.train import benchmark_pretraining, pretrain

CPU = torch.device("cpu")
ONE_PROCESS = DistInfo(rank=0, world_size=1, local_rank=0, device=CPU)
DOCUMENTED_KEYS = {"step", "loss", "mlm_loss", "nsp_loss", "mlm_acc", "lr", "grad_norm",
                   "seq_per_s", "tokens_per_s"}

# First 4 steps of the debug/tiny-cpu recipe (bert-tiny, LAMB lr 1e-2, warm-up 0.05, fp32,
# seed 12345) on the session's tiny data, with max_steps=4 and global batch 8 = 2 x 4. Recorded
# from this test's metrics.jsonl when the engine was verified (one thread; two threads agree to
# 1e-6). A failure means init, data order, masking, dropout, loss or optimizer changed: update
# the values only for an intended change, and say why in the commit (last: the encoder's last
# layer runs only at the heads' rows, so it draws fewer dropout masks).
GOLDEN = [  # (step, loss, mlm_loss, nsp_loss)
    (1, 6.971711158752441, 6.199350357055664, 0.7723605632781982),
    (2, 6.850462913513184, 6.162725925445557, 0.687737226486206),
    (3, 6.73381233215332, 6.104936599731445, 0.628875732421875),
    (4, 6.654466152191162, 6.0944671630859375, 0.5599992275238037),
]


def test_golden_losses_of_the_debug_recipe(tmp_path: Path, tiny_config, run_metrics) -> None:
    cfg = tiny_config(tmp_path, "--model=bert-tiny", "--train.max_steps=4",
                      "--train.eval_batches=0")
    assert cfg.optim.lr == 1e-2 and cfg.precision == "fp32" and cfg.train.seed == 12345
    pretrain(cfg)
    got = [(r["step"], r["loss"], r["mlm_loss"], r["nsp_loss"]) for r in run_metrics(tmp_path)]
    assert [g[0] for g in got] == [g[0] for g in GOLDEN]
    for g, want in zip(got, GOLDEN):
        assert g[1:] == pytest.approx(want[1:], abs=1e-4), g[0]


def test_finished_run_outputs(tmp_path: Path, tiny, tiny_config, run_metrics) -> None:
    cfg = tiny_config(tmp_path, "--train.max_steps=4", "--train.eval_every=2",
                      "--checkpoint.every=2", "--checkpoint.keep=1")
    result = pretrain(cfg)
    assert result.step == 4 and not result.preempted

    lines = run_metrics(tmp_path)
    raw = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in raw if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    for r in train:
        assert DOCUMENTED_KEYS <= set(r) and "loss_scale" not in r
        assert all(math.isfinite(v) for v in r.values())
        assert r["loss"] == pytest.approx(r["mlm_loss"] + r["nsp_loss"], rel=1e-6)
        assert 0 <= r["mlm_acc"] <= 1 and r["seq_per_s"] > 0 and r["tokens_per_s"] > 0
    # Validation at steps 2 and 4; the end-of-run pass reuses step 4's instead of repeating it.
    val = [r for r in lines if "val_loss" in r]
    assert [r["step"] for r in val] == [2, 4]
    assert set(result.validation) == {"val_loss", "val_mlm_loss", "val_mlm_acc"}
    assert result.validation == {k: v for k, v in val[-1].items() if k != "step"}

    assert (tmp_path / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert load_config(PretrainConfig, tmp_path / "config.yaml") == cfg  # resolved, reloadable
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-4"]  # keep=1
    assert result.final_checkpoint == tmp_path / "checkpoint-4"
    assert (result.final_checkpoint / "vocab.txt").read_text() == tiny.vocab.read_text()


def test_final_checkpoint_loads_in_transformers(tmp_path: Path, tiny_config) -> None:
    transformers = pytest.importorskip("transformers")
    ckpt = pretrain(tiny_config(tmp_path, "--train.max_steps=2")).final_checkpoint
    hf, info = transformers.BertForPreTraining.from_pretrained(ckpt, output_loading_info=True)
    assert info["missing_keys"] in ([], set()) and info["unexpected_keys"] in ([], set())
    ours = BertForPreTraining.from_pretrained(ckpt)
    hf.eval()

    data = open_pretrain_data(tiny_config(tmp_path / "unused"), ONE_PROCESS)
    batch = next(iter(data.train))
    ids, mask, types = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, token_type_ids=types)
        b = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    real = mask.bool()
    torch.testing.assert_close(a.mlm_logits[real], b.prediction_logits[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.nsp_logits, b.seq_relationship_logits, rtol=1e-5, atol=1e-5)


def test_fp16_run_logs_the_loss_scale(tmp_path: Path, tiny_config, run_metrics) -> None:
    pretrain(tiny_config(tmp_path, "--precision=fp16", "--train.max_steps=2",
                         "--train.eval_batches=0"))
    lines = run_metrics(tmp_path)
    assert [r["step"] for r in lines] == [1, 2]
    for r in lines:
        assert r["loss_scale"] == 2.0**16 and r["skipped_steps"] == 0
    state = tmp_path / "checkpoint-2" / "training_state"
    assert torch.load(state / "scaler.pt", weights_only=True)["scale"] == 2.0**16


def sequence_flops(layers: int, hidden: int, inter: int, vocab: int, s: int, p: int) -> float:
    """Training FLOPs of one sequence counted matmul by matmul (2 m k n each), x3 for backward.
    The last layer computes its queries and everything after them at the q = p + 1 tokens the
    heads read (the p masked positions and the first token)."""
    h = hidden

    def layer(q: int) -> int:
        return (2 * s * h * 2 * h         # K, V projections
                + 2 * q * h * h           # Q projection
                + 2 * q * s * h * 2       # scores Q K^T and the weighted sum P V
                + 2 * q * h * h           # attention output projection
                + 2 * q * h * inter * 2)  # feed-forward up and down
    heads = 2 * p * h * h + 2 * p * h * vocab + 2 * h * h + 2 * h * 2  # MLM, pooler, NSP
    return 3.0 * ((layers - 1) * layer(s) + layer(p + 1) + heads)


def test_benchmark_mode(tmp_path: Path, tiny, tiny_config) -> None:
    cfg = tiny_config(tmp_path, "--benchmark.warmup_steps=1", "--benchmark.steps=2")
    report = benchmark_pretraining(cfg)
    assert json.loads((tmp_path / "benchmark.json").read_text()) == report
    assert not list(tmp_path.glob("checkpoint-*")) and not (tmp_path / "metrics.jsonl").exists()
    assert report["timed_steps"] == 2 and report["accumulation"] == 2
    assert report["compiled"] is False  # train.compile's default on a CPU
    assert report["mfu"] is None and "unknown" in report["mfu_note"]
    assert report["peak_memory_gib"] > 0
    # unpadded (the default) with the loader's layout: only the non-finite guard waits
    assert report["host_syncs_per_step"] == {"read a value (.item(), bool(), int())": 1}

    # Recount what the timed steps saw: the same loader, past the warm-up step's micro-batches.
    stream = iter(open_pretrain_data(cfg, ONE_PROCESS).train)
    batches = [next(stream) for _ in range(2 * 3)][2:]
    model = json.loads((tiny.model).read_text())
    vocab = -(-json.loads((tiny.data / "manifest.json").read_text())["vocab_size"] // 8) * 8
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    flops = sum(sequence_flops(model["num_hidden_layers"], model["hidden_size"],
                               model["intermediate_size"], vocab, int(s), int(p))
                for b in batches
                for s, p in zip(b["attention_mask"].sum(1), b["mlm_labels"].ne(-100).sum(1)))
    seconds = report["seconds"]
    assert seconds > 0 and report["sequences_per_s"] > 0
    assert report["sequences_per_s"] * seconds == pytest.approx(2 * 8, rel=1e-9)
    assert report["tokens_per_s"] * seconds == pytest.approx(tokens, rel=1e-9)
    assert report["model_tflops_per_s"] * 1e12 * seconds == pytest.approx(flops, rel=1e-9)


def test_packed_run_trains_like_the_unpacked_run(tmp_path: Path, tiny, tiny_config,
                                                 run_metrics) -> None:
    """data.pack_sequences=true: the same samples per micro-batch, packed into fewer rows of
    max_seq_length; losses and weights agree with the unpacked run (no dropout)."""
    runs = {}
    for pack in ("false", "true"):
        out = tmp_path / pack
        cfg = tiny_config(out, f"--model={tiny.model_nodrop}", "--train.max_steps=4",
                          f"--data.pack_sequences={pack}")
        assert pretrain(cfg).step == 4
        runs[pack] = out
    got, want = ([r for r in run_metrics(runs[p]) if "loss" in r] for p in ("true", "false"))
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "grad_norm"):
        assert [r[key] for r in got] == pytest.approx([r[key] for r in want], rel=1e-4), key
    # the packing efficiency is reported, and packing never fills rows worse than padding
    assert all(0 < w["row_fill"] <= g["row_fill"] <= 1 for g, w in zip(got, want))
    wa = load_file(str(runs["true"] / "checkpoint-4" / "model.safetensors"))
    wb = load_file(str(runs["false"] / "checkpoint-4" / "model.safetensors"))
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-4, atol=1e-5, msg=name)


def test_batch_sizes_must_divide_over_ranks(tmp_path: Path, tiny_config,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # 12 = 3 micro-batches of 4 passes the config check, but not 4 x 2 ranks: the run says so.
    monkeypatch.setattr(run_module, "init_distributed",
                        lambda **kw: DistInfo(rank=0, world_size=2, local_rank=0, device=CPU))
    cfg = tiny_config(tmp_path, "--train.global_batch_size=12")
    with pytest.raises(ConfigError, match=r"train\.global_batch_size=12 is not a multiple of "
                                          r"train\.micro_batch_size=4 x 2 ranks = 8.*e\.g\. 16"):
        pretrain(cfg)
    assert not list(tmp_path.iterdir())  # nothing written before the check


def test_data_errors_name_the_problem(tmp_path: Path, tiny_config) -> None:
    with pytest.raises(ConfigError, match=r"data\.path is not set.*--data\.path=DIR"):
        pretrain(load_config(PretrainConfig, None, [f"--output_dir={tmp_path}"]))
    missing = tmp_path / "no-such-data"
    with pytest.raises(DataError, match=rf"{missing}: no such file or directory"):
        pretrain(tiny_config(tmp_path, f"--data.path={missing}"))
    # The debug recipe's own global batch (64) exceeds the 29 training sequences of the tiny data.
    with pytest.raises(DataError, match=r"fewer samples than one global batch of 64"):
        pretrain(tiny_config(tmp_path, "--train.global_batch_size=64",
                             "--train.micro_batch_size=32", "--data.bin_by_length=false"))


def test_model_follows_the_data_and_refuses_short_positions(tmp_path: Path, tiny,
                                                            tiny_config) -> None:
    from bertforge.commands.train import pretraining_task

    def build(*overrides: str):
        return pretraining_task(tiny_config(tmp_path, *overrides), ONE_PROCESS).build_model(None)

    model = build("--model=bert-tiny")
    manifest = json.loads((Path(tiny.data) / "manifest.json").read_text())
    assert model.config.vocab_size == manifest["vocab_size"]
    assert model.config.pad_token_id == manifest["special_ids"]["pad"]
    assert model.config.do_lower_case == manifest["do_lower_case"]

    short = tmp_path / "short.json"   # the tiny data has sequences of 32 tokens
    short.write_text(json.dumps({"hidden_size": 32, "num_hidden_layers": 1,
                                 "num_attention_heads": 2, "intermediate_size": 64,
                                 "max_position_embeddings": 16}))
    with pytest.raises(ConfigError, match=r"sequences of up to 32 tokens but the model has 16 "
                                          r"positions; prepare with --max-seq-length 16"):
        build(f"--model={short}")


def test_tensorboard_events_are_written(tmp_path: Path, tiny_config) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    pretrain(tiny_config(tmp_path, "--train.max_steps=4", "--train.log_every=2",
                         "--tensorboard=true"))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [2, 4]
    assert {"mlm_loss", "lr", "grad_norm", "val_loss"} <= set(events.Tags()["scalars"])


def test_a_run_reads_the_data_manifest_once(tmp_path: Path, tiny, tiny_config,
                                            monkeypatch) -> None:
    """The prepared data's manifest.json is read once per run (six times before): the task is
    chosen by its objective and the train and validation streams share it."""
    import bertforge.data.native as native

    real, reads = native.read_manifest, []

    def counting(path, **kwargs):
        reads.append(Path(path))
        return real(path, **kwargs)

    monkeypatch.setattr(native, "read_manifest", counting)
    pretrain(tiny_config(tmp_path, "--train.max_steps=2", "--train.eval_batches=2"))
    assert len(reads) == 1, reads
