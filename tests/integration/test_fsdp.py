"""FSDP2 (train.fsdp) on two gloo CPU ranks trains like DDP and like one process with
accumulation, resumes exactly, and writes checkpoints transformers loads.

The same layout as tests/integration/test_ddp.py: global batch 8, one process with micro-batches
of 4 twice per step, or two ranks with one micro-batch of 4 each, and a model without dropout.
FSDP differs from DDP only in the order of float additions (a reduce-scatter instead of an
all-reduce; shard norms summed over ranks), so weights agree to ~1e-5 relative, the tolerance of
the DDP test. A stopped and resumed FSDP run equals the uninterrupted one bitwise.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from ranks import STEPS, assert_lines_close, assert_weights_close, free_port, run_args, torchrun

from bertforge.errors import CheckpointError
from bertforge.commands.train import pretrain
from bertforge.train.checkpoint import SHARDED_OPTIMIZER
from bertforge.train.guards import verify_checkpoint

FSDP = "--train.fsdp=true"


@pytest.fixture(scope="module")
def fsdp(tiny, tiny_args, child_env, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    torchrun(run_args(tiny, tiny_args, out, FSDP), child_env, out)
    return out


def test_fsdp_equals_ddp_and_one_process(single: Path, ddp: Path, fsdp: Path,
                                         run_metrics) -> None:
    for step in (2, STEPS):
        assert_weights_close(fsdp / f"checkpoint-{step}", ddp / f"checkpoint-{step}")
        assert_weights_close(fsdp / f"checkpoint-{step}", single / f"checkpoint-{step}")
    assert_lines_close(run_metrics(fsdp), run_metrics(ddp))
    assert_lines_close(run_metrics(fsdp), run_metrics(single))

    state = fsdp / f"checkpoint-{STEPS}" / "training_state"
    assert not (state / "optimizer.pt").exists()
    shards = sorted(p.name for p in (state / SHARDED_OPTIMIZER).iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    meta = json.loads((state / "meta.json").read_text())
    assert meta["world_size"] == 2
    assert {f"{SHARDED_OPTIMIZER}/{n}" for n in shards} <= set(meta["files"])
    verify_checkpoint(fsdp / f"checkpoint-{STEPS}")


def test_fsdp_checkpoint_is_a_transformers_model(ddp: Path, fsdp: Path) -> None:
    transformers = pytest.importorskip("transformers")
    ckpt = fsdp / f"checkpoint-{STEPS}"
    assert json.loads((ckpt / "config.json").read_text())["architectures"] == [
        "BertForPreTraining"]
    hf, info = transformers.BertForPreTraining.from_pretrained(ckpt, output_loading_info=True)
    assert not any(info.values()), info
    ours = load_file(ddp / f"checkpoint-{STEPS}" / "model.safetensors")
    for name, tensor in hf.state_dict().items():
        if name in ours:
            torch.testing.assert_close(tensor, ours[name], rtol=1e-5, atol=1e-6, msg=name)
    # The MLM decoder is still the word embedding (tied), as transformers ties it on load.
    assert torch.equal(hf.cls.predictions.decoder.weight,
                       hf.bert.embeddings.word_embeddings.weight)


def test_fsdp_resume_is_exact(tiny, tiny_args, child_env, fsdp: Path, run_metrics,
                              tmp_path: Path) -> None:
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(fsdp / "checkpoint-2", resumed / "checkpoint-2")
    torchrun(run_args(tiny, tiny_args, resumed, FSDP), child_env, resumed)
    final = f"checkpoint-{STEPS}"
    assert ((resumed / final / "model.safetensors").read_bytes()
            == (fsdp / final / "model.safetensors").read_bytes())
    assert run_metrics(resumed) == [r for r in run_metrics(fsdp) if r["step"] > 2]


def test_ddp_checkpoint_resumes_with_fsdp_and_gradient_checkpointing(
        tiny, tiny_args, child_env, ddp: Path, fsdp: Path, run_metrics, tmp_path: Path) -> None:
    """A DDP run's full optimizer.pt is sharded on load; activation checkpointing recomputes
    each FSDP layer (gathering its weights again) in backward."""
    out = tmp_path / "switch"
    out.mkdir()
    shutil.copytree(ddp / "checkpoint-2", out / "checkpoint-2")
    torchrun(run_args(tiny, tiny_args, out, FSDP, "--train.gradient_checkpointing=true"),
             child_env, out)
    assert_weights_close(out / f"checkpoint-{STEPS}", fsdp / f"checkpoint-{STEPS}")
    assert_lines_close(run_metrics(out), [r for r in run_metrics(ddp) if r["step"] > 2])


def test_fsdp_checkpoint_resumes_in_one_process(tiny, tiny_config, single: Path, fsdp: Path,
                                                tmp_path: Path) -> None:
    """The sharded optimizer state is read whole where nothing is sharded (train.fsdp=true in
    one process is a no-op)."""
    cfg = tiny_config(tmp_path / "one", f"--model={tiny.model_nodrop}",
                      f"--train.max_steps={STEPS}", f"--resume={fsdp / 'checkpoint-2'}", FSDP)
    assert pretrain(cfg).step == STEPS
    assert_weights_close(tmp_path / "one" / f"checkpoint-{STEPS}", single / f"checkpoint-{STEPS}")


def test_damaged_shard_is_named(tiny, tiny_config, fsdp: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint-2"
    shutil.copytree(fsdp / "checkpoint-2", ckpt)
    shard = ckpt / "training_state" / SHARDED_OPTIMIZER / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-7] + b"garbage")
    with pytest.raises(CheckpointError, match=f"{SHARDED_OPTIMIZER}/__1_0.distcp") as err:
        verify_checkpoint(ckpt)
    assert "\n" not in str(err.value)
    shard.unlink()
    cfg = tiny_config(tmp_path / "run", f"--model={tiny.model_nodrop}", f"--resume={ckpt}")
    with pytest.raises(CheckpointError, match=f"{SHARDED_OPTIMIZER}/__1_0.distcp") as err:
        pretrain(cfg)
    assert "\n" not in str(err.value)


NORMS_SCRIPT = r'''
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from bertforge.optim.lamb import Lamb, clip_grad_norm_, global_grad_norm


def main():
    """Everything that holds the process group (mesh, DTensors) lives in this frame, so it is
    freed while the interpreter is whole (see RANKS_END)."""
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    shapes = [(5, 3), (7,), (1, 4), (2, 2)]  # uneven (5, 7), one rank empty (1), even (2)
    full = [torch.randn(s, dtype=torch.float64) for s in shapes]
    grads = [torch.randn(s, dtype=torch.float64) * 3 for s in shapes]

    def shard(t):
        return distribute_tensor(t.clone(), mesh, [Shard(0)], src_data_rank=None)

    def params(sharded):
        out = []
        for w, g in zip(full, grads):
            p = torch.nn.Parameter(shard(w) if sharded else w.clone())
            p.grad = shard(g) if sharded else g.clone()
            out.append(p)
        return out

    plain, dtens = params(False), params(True)
    want, got = global_grad_norm([p.grad for p in plain]), global_grad_norm([p.grad for p in dtens])
    assert type(got) is torch.Tensor and got.dtype == torch.float64, (type(got), got.dtype)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(clip_grad_norm_(dtens, 1.0), clip_grad_norm_(plain, 1.0), rtol=1e-12, atol=0)
    for p, q in zip(dtens, plain):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-12, atol=0)

    plain, dtens = params(False), params(True)
    groups = lambda ps: [{"params": ps[:2], "weight_decay": 0.01}, {"params": ps[2:], "weight_decay": 0.0}]
    opts = [Lamb(groups(ps), lr=0.1, max_grad_norm=1.0) for ps in (plain, dtens)]
    for _ in range(3):
        for opt in opts:
            opt.step()
    for p, q in zip(dtens, plain):
        torch.testing.assert_close(p.full_tensor(), q, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(opts[1].last_grad_norm, opts[0].last_grad_norm, rtol=1e-12, atol=0)
    for p, q in zip(dtens, plain):
        torch.testing.assert_close(opts[1].state[p]["exp_avg"].full_tensor(), opts[0].state[q]["exp_avg"])


dist.init_process_group("gloo")
main()
'''


# Appended to each script: a rank exits only after its process group is gone. Objects that hold
# the group (a device mesh, DTensors, an FSDP model) live in the script's main(); were they freed
# at interpreter exit instead, gloo's threads could touch Python objects after finalization began
# and abort the rank ("terminate called without an active exception") after it passed.
RANKS_END = '''
import gc
gc.collect()  # what main() left in reference cycles goes now, while Python is whole
dist.barrier()  # no rank tears gloo down while another still talks to it
dist.destroy_process_group()  # the group's last reference: its threads end here
print({done!r})
'''


def run_on_two_ranks(script_text: str, child_env, tmp_path: Path, done: str) -> None:
    script = tmp_path / "script.py"
    script.write_text(script_text + RANKS_END.format(done=done))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script)]
    proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(done) == 2


def test_norms_of_sharded_tensors_are_full_tensor_norms(child_env, tmp_path: Path) -> None:
    """global_grad_norm, clip_grad_norm_ and LAMB (trust ratios, clipping, moments) on
    DTensor-sharded float64 parameters equal the unsharded computation to 1e-12."""
    run_on_two_ranks(NORMS_SCRIPT, child_env, tmp_path, "norms ok")


STABLE_ADAMW_SCRIPT = r'''
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from bertforge.optim import StableAdamW



def main():
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    shapes = [(6, 4), (5, 3), (7,), (1, 4)]  # even, uneven, 1-D, one rank empty
    full = [torch.randn(s, dtype=torch.float64) for s in shapes]
    grads = [[torch.randn(s, dtype=torch.float64) for s in shapes] for _ in range(4)]
    # Step 3: rank 0's rows of the first tensor jump 10x, rank 1's fall 10x. Its full-tensor rms
    # is above 1 while rank 1's half alone is below: a per-shard rms would clip differently.
    grads[2][0][:3] *= 10
    grads[2][0][3:] *= 0.1

    def shard(t):
        return distribute_tensor(t.clone(), mesh, [Shard(0)], src_data_rank=None)

    def train(sharded):
        ps = [torch.nn.Parameter(shard(w) if sharded else w.clone()) for w in full]
        opt = StableAdamW([{"params": ps[:2], "weight_decay": 0.1},
                           {"params": ps[2:], "weight_decay": 0.0}], lr=0.1, decouple_lr=True)
        for step in grads:
            for p, g in zip(ps, step):
                p.grad = shard(g) if sharded else g.clone()
            opt.step()
        return ps, opt

    plain, opt_plain = train(False)
    dtens, opt_dtens = train(True)
    for p, q in zip(dtens, plain):
        torch.testing.assert_close(p.full_tensor(), q, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(opt_dtens.state[p]["exp_avg_sq"].full_tensor(),
                                   opt_plain.state[q]["exp_avg_sq"], rtol=1e-12, atol=0)


dist.init_process_group("gloo")
main()
'''


def test_stable_adamw_rms_on_shards_is_the_full_tensors(child_env, tmp_path: Path) -> None:
    """StableAdamW on DTensor shards over two gloo ranks equals the unsharded run to 1e-12,
    including a step where only the full-tensor rms (not a shard's) clips."""
    run_on_two_ranks(STABLE_ADAMW_SCRIPT, child_env, tmp_path, "sharded ok")


MIXED_PRECISION_SCRIPT = r'''
import torch, torch.distributed as dist
from bertforge.models import BertConfig, BertForMaskedLM
from bertforge.train.distributed import init_distributed, shard_model


def main(info):
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=64,
                                       max_position_embeddings=32))
    assert shard_model(model, info, torch.bfloat16)
    seen = []
    layer = model.bert.encoder.layer[1].intermediate.dense
    layer.register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    ids = torch.randint(5, 64, (2, 12))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, attention_mask=torch.ones_like(ids))
    out.logits.float().sum().backward()
    assert seen == [torch.bfloat16], seen                   # gathered for compute in bf16
    for name, p in model.named_parameters():                # the shards: fp32 master weights
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, name


main(init_distributed(device="cpu"))
'''


def test_fsdp_gathers_weights_in_the_compute_dtype(child_env, tmp_path: Path) -> None:
    """With bf16, FSDP2 all-gathers each layer's weights in bf16 (half the traffic of fp32) while
    the shards, their gradients and so the optimizer stay fp32."""
    run_on_two_ranks(MIXED_PRECISION_SCRIPT, child_env, tmp_path, "mixed precision ok")


TINY_BART = {"model_type": "bart", "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
             "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
             "decoder_ffn_dim": 64, "max_position_embeddings": 80, "dropout": 0.0,
             "attention_dropout": 0.0, "activation_dropout": 0.0}


def test_bart_denoising_with_fsdp_equals_one_process(child_env, tmp_path: Path) -> None:
    from bertforge.config import PretrainConfig, load_config
    from bertforge.data.prepare import prepare
    from bertforge.recipes import resolve_recipe
    from bertforge.tokenization.training import train_bpe

    corpus = Path(__file__).resolve().parents[1] / "assets" / "tiny_corpus.txt"
    train_bpe([corpus], vocab_size=400, output=tmp_path / "bpe", min_frequency=1, progress=False)
    prepare([corpus], vocab=tmp_path / "bpe", output=tmp_path / "data", objective="denoise",
            max_seq_length=48, validation_fraction=0.2, workers=1, progress=False)
    model = tmp_path / "bart.json"
    model.write_text(json.dumps(TINY_BART))
    recipe = resolve_recipe("debug/bart-tiny-cpu")

    def args(out: Path, *extra: str) -> list[str]:
        return [f"--model={model}", f"--data.path={tmp_path / 'data'}", f"--output_dir={out}",
                "--train.max_steps=3", "--train.global_batch_size=8",
                "--train.micro_batch_size=4", "--train.log_every=1", "--train.eval_every=0",
                "--train.eval_batches=2", "--checkpoint.every=1000", "--checkpoint.keep=0",
                "--tensorboard=false", *extra]

    one = tmp_path / "one"
    assert pretrain(load_config(PretrainConfig, recipe, args(one))).step == 3
    two = tmp_path / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "bertforge.cli",
           "pretrain", "--config", str(recipe), *args(two, FSDP)]
    proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_weights_close(two / "checkpoint-3", one / "checkpoint-3")

    transformers = pytest.importorskip("transformers")
    _, info = transformers.BartForConditionalGeneration.from_pretrained(
        two / "checkpoint-3", output_loading_info=True)
    assert not any(info.values()), info
