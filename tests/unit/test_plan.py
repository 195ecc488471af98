"""`bertforge plan`: micro-batch and accumulation proposals that divide the global batch, grow
with GPU memory, fit the memory estimate, and refuse impossible set-ups with a reason."""

from __future__ import annotations

import math

import pytest

from bertforge.errors import ConfigError
from bertforge.train.plan import GIB, plan_batch

MEMORIES = (16, 24, 40, 80, 141)


@pytest.mark.parametrize("model, seq_len, gpus, global_batch", [
    ("bert-large-uncased", 128, 8, 65536),
    ("bert-large-uncased", 512, 8, 32768),
    ("bert-base-uncased", 128, 3, 96),
    ("bert-base-uncased", 512, 1, 256),
    ("bert-tiny", 64, 2, 64),
])
def test_proposals_divide_the_global_batch_and_grow_with_memory(model: str, seq_len: int,
                                                                gpus: int,
                                                                global_batch: int) -> None:
    micro_sizes = []
    for memory in MEMORIES:
        plan = plan_batch(model=model, seq_len=seq_len, gpus=gpus, gpu_memory_gib=memory,
                          global_batch_size=global_batch)
        assert plan.micro_batch_size * gpus * plan.accumulation == global_batch
        assert plan.accumulation >= 1 and plan.micro_batch_size >= 1
        # It fits: model states + activations within the usable part of the GPU.
        assert plan.estimated_gib <= memory * 0.85 - 2.0
        assert plan.estimated_gib == pytest.approx(
            plan.states_gib + plan.micro_batch_size * plan.activations_gib_per_seq)
        micro_sizes.append(plan.micro_batch_size)
    assert micro_sizes == sorted(micro_sizes)  # a bigger GPU never gets a smaller micro-batch
    assert micro_sizes[-1] > micro_sizes[0] or micro_sizes[0] == global_batch // gpus


def test_model_states_are_16_bytes_per_parameter() -> None:
    # BERT-large: 335M parameters with its 30522-token vocabulary padded to 30528.
    plan = plan_batch(model="bert-large-uncased", seq_len=128, gpus=8, gpu_memory_gib=80,
                      global_batch_size=65536)
    assert plan.states_gib * GIB / 16 == pytest.approx(335e6, rel=0.01)


def test_longer_sequences_and_fp32_need_more_memory_per_sequence() -> None:
    def per_seq(**kw) -> float:
        args = dict(model="bert-base-uncased", seq_len=128, gpus=1, gpu_memory_gib=80,
                    global_batch_size=256, precision="bf16")
        return plan_batch(**{**args, **kw}).activations_gib_per_seq

    assert per_seq(seq_len=512) > 3.9 * per_seq(seq_len=128)
    assert per_seq(precision="fp32") > 1.9 * per_seq(precision="bf16")


def test_summary_gives_the_config_overrides() -> None:
    plan = plan_batch(model="bert-large-uncased", seq_len=128, gpus=8, gpu_memory_gib=80,
                      global_batch_size=65536)
    text = plan.summary()
    assert (f"global batch 65536 = micro-batch {plan.micro_batch_size} x 8 GPUs x "
            f"{plan.accumulation} accumulation steps") in text
    assert (f"--train.global_batch_size=65536 --train.micro_batch_size={plan.micro_batch_size}"
            in text)


@pytest.mark.parametrize("kw, message", [
    (dict(gpus=0), r"gpus \(0\), global batch size .* must be positive"),
    (dict(gpu_memory_gib=-1.0), r"GPU memory \(-1\.0 GiB\)"),
    (dict(seq_len=0), r"sequence length \(0\)"),
    (dict(global_batch_size=100), r"global batch size 100 is not divisible by 8 GPUs"),
    (dict(gpu_memory_gib=2.0), r"bert-large-uncased does not fit in 2\.0 GiB per GPU at "
                               r"sequence length 128"),
    (dict(seq_len=1024), r"sequence length 1024 exceeds bert-large-uncased's "
                         r"max_position_embeddings \(512\)"),
    (dict(model="bert-hueg"), r"'bert-hueg' is neither .* nor a preset"),
])
def test_impossible_setups_are_explained(kw: dict, message: str) -> None:
    args = dict(model="bert-large-uncased", seq_len=128, gpus=8, gpu_memory_gib=80.0,
                global_batch_size=65536)
    with pytest.raises(ConfigError, match=message):
        plan_batch(**{**args, **kw})


def test_learning_rate_proposal_scales_with_the_square_root_of_the_batch() -> None:
    from bertforge.train.plan import proposed_lr

    assert proposed_lr("lamb", 65536) == pytest.approx(6e-3)
    # A published recipe's batch gets the recipe's value (NVIDIA's phase 2: 4e-3 at 32768,
    # where the rule from phase 1 would give 4.24e-3); other batches scale from the nearest.
    assert proposed_lr("lamb", 32768) == 4e-3
    assert proposed_lr("lamb", 16384) == pytest.approx(4e-3 * math.sqrt(0.5))
    assert proposed_lr("lamb", 30720, "bart") == 4e-3
    assert proposed_lr("lamb", 30720) == pytest.approx(4e-3 * math.sqrt(30720 / 32768))
    assert proposed_lr("adamw", 256) == pytest.approx(1e-4)
    assert proposed_lr("adamw", 1024) == pytest.approx(2e-4)
    with pytest.raises(ConfigError, match="choose one of lamb, adamw"):
        proposed_lr("sgd", 256)
    plan = plan_batch(model="bert-large-uncased", seq_len=128, gpus=8, gpu_memory_gib=80,
                      global_batch_size=65536)
    (line,) = [x for x in plan.summary().splitlines() if x.startswith("learning rate:")]
    assert "--optim.name=lamb --optim.lr=6.00e-03 (NVIDIA's BERT phase 1's value at this " \
           "batch)" in line and "not advised" in line
    small = plan_batch(model="bert-base-uncased", seq_len=128, gpus=1, gpu_memory_gib=80,
                       global_batch_size=256)
    assert "--optim.name=adamw --optim.lr=1.00e-04" in small.summary()
    assert "not advised" not in small.summary()


def test_bart_models_are_planned_and_the_answer_ends_with_a_command_to_run() -> None:
    bart = plan_batch(model="bart-large-preln", seq_len=128, gpus=16, gpu_memory_gib=80,
                      global_batch_size=64000)
    bert = plan_batch(model="bert-large-uncased", seq_len=128, gpus=16, gpu_memory_gib=80,
                      global_batch_size=64000)
    # Every target token's logits (BART) against the masked positions' (BERT's sparse head).
    assert bart.activations_gib_per_seq > bert.activations_gib_per_seq
    text = bart.summary()
    assert "--optim.lr=6.00e-03 (NVIDIA's BART phase 1's value at this batch)" in text
    assert text.splitlines()[-1] == (
        "  torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d "
        "--rdzv_endpoint=$HEAD:29500 -m bertforge.cli pretrain --config pretrain/bart-large-phase1 "
        f"--data.path=DATA --train.global_batch_size=64000 --train.micro_batch_size="
        f"{bart.micro_batch_size} --optim.name=lamb --optim.lr=6.00e-03 --precision=bf16")
    mini = plan_batch(model="bert-mini", seq_len=512, gpus=1, gpu_memory_gib=24,
                      global_batch_size=256).summary()
    assert "x 1 GPU x 1 accumulation step\n" in mini
    assert mini.splitlines()[-1].startswith(
        "  torchrun --nproc_per_node=1 -m bertforge.cli pretrain --config "
        "pretrain/bert-base-phase2 --model=bert-mini --data.path=DATA")
