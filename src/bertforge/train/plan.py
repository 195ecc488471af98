"""Propose micro-batch size and gradient accumulation for a GPU set-up.

An estimate, not a measurement: memory per GPU = model states + activations per sequence x
micro-batch. Model states with mixed precision and LAMB/Adam: fp32 weights, fp32 gradients and two
fp32 moments = 16 bytes per parameter. Activations per layer per sequence, 16-bit, without
recomputation and with a fused (flash) attention kernel: about 34 x S x H bytes (Korthikanti et
al., 2022, without the 5 x heads x S^2 term that fused attention does not store); doubled for fp32.
Use `bertforge pretrain --benchmark` to check the proposal on the real machine.

Learning rate: square-root scaling with the global batch (the rule under which LAMB was shown to
keep accuracy as the batch grows, You et al., 2020) from a published point per optimizer: LAMB
6e-3 at 65536 sequences (NVIDIA's BERT phase 1; the rule then gives 4.2e-3 at 32768, 6% above
NVIDIA's phase-2 4e-3) and Adam(W) 1e-4 at 256 (the BERT paper). AdamW is not advised far
beyond a few thousand sequences: that is the regime LAMB was made for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bertforge.errors import ConfigError

GIB = 2**30
_RESERVED_GIB = 2.0     # CUDA context, allocator slack, NCCL buffers
_USABLE = 0.85          # leave headroom for fragmentation
# (global batch, peak learning rate) that each optimizer's proposal scales from.
LR_REFERENCE = {"lamb": (65536, 6e-3), "adamw": (256, 1e-4)}
_ADAMW_MAX_BATCH = 8192  # beyond this, the proposal advises LAMB


def proposed_lr(optimizer: str, global_batch_size: int) -> float:
    """Peak learning rate for ``optimizer`` ("lamb" or "adamw") at ``global_batch_size``:
    the reference point scaled by sqrt(global batch / reference batch)."""
    if optimizer not in LR_REFERENCE:
        raise ConfigError(f"optimizer {optimizer!r}: choose one of {', '.join(LR_REFERENCE)}")
    if global_batch_size < 1:
        raise ConfigError(f"global batch size must be >= 1, got {global_batch_size}")
    batch, lr = LR_REFERENCE[optimizer]
    return lr * math.sqrt(global_batch_size / batch)


@dataclass
class BatchPlan:
    micro_batch_size: int
    accumulation: int
    gpus: int
    global_batch_size: int
    states_gib: float
    activations_gib_per_seq: float
    gpu_memory_gib: float

    @property
    def estimated_gib(self) -> float:
        return self.states_gib + self.micro_batch_size * self.activations_gib_per_seq

    def summary(self) -> str:
        return "\n".join([
            f"global batch {self.global_batch_size} = micro-batch {self.micro_batch_size} "
            f"x {self.gpus} GPUs x {self.accumulation} accumulation steps",
            f"estimated memory per GPU: {self.estimated_gib:.1f} of {self.gpu_memory_gib:.0f} GiB "
            f"(model states {self.states_gib:.1f} GiB, activations "
            f"{self.activations_gib_per_seq * 1024:.0f} MiB per sequence)",
            f"config: --train.global_batch_size={self.global_batch_size} "
            f"--train.micro_batch_size={self.micro_batch_size}",
            self.lr_line(),
        ])

    def lr_line(self) -> str:
        """The learning-rate proposal for both optimizers (see the module docstring)."""
        lamb = proposed_lr("lamb", self.global_batch_size)
        adamw = proposed_lr("adamw", self.global_batch_size)
        note = ("" if self.global_batch_size <= _ADAMW_MAX_BATCH else
                " (AdamW is not advised at this batch size: use LAMB)")
        return (f"learning rate (square-root scaling): --optim.name=lamb --optim.lr={lamb:.2e}, "
                f"or --optim.name=adamw --optim.lr={adamw:.2e}{note}")


def plan_batch(*, model: str, seq_len: int, gpus: int, gpu_memory_gib: float,
               global_batch_size: int, precision: str = "bf16",
               max_predictions: int | None = None) -> BatchPlan:
    from bertforge.models import BertConfig

    if gpus < 1 or global_batch_size < 1 or gpu_memory_gib <= 0 or seq_len < 1:
        raise ConfigError(f"gpus ({gpus}), global batch size ({global_batch_size}), GPU memory "
                          f"({gpu_memory_gib} GiB) and sequence length ({seq_len}) must be positive")
    if global_batch_size % gpus:
        raise ConfigError(f"global batch size {global_batch_size} is not divisible by {gpus} GPUs")
    cfg = BertConfig.load(model)
    if seq_len > cfg.max_position_embeddings:
        raise ConfigError(f"sequence length {seq_len} exceeds {model}'s max_position_embeddings "
                          f"({cfg.max_position_embeddings}); plan for at most that many tokens")
    h, layers, v = cfg.hidden_size, cfg.num_hidden_layers, cfg.padded_vocab_size
    params = cfg.num_parameters()
    preds = max_predictions if max_predictions is not None else max(1, round(0.15 * seq_len))
    act_bytes = 2 if precision in ("bf16", "fp16") else 4
    per_seq = layers * 34 * seq_len * h * act_bytes / 2 + preds * v * (act_bytes + 4)
    states = 16 * params / GIB
    budget = gpu_memory_gib * _USABLE - _RESERVED_GIB - states
    if budget <= per_seq / GIB:
        raise ConfigError(f"{model} does not fit in {gpu_memory_gib} GiB per GPU at sequence "
                          f"length {seq_len}, even one sequence at a time")
    per_gpu = global_batch_size // gpus
    micro = 1
    while micro * 2 * per_seq / GIB <= budget and per_gpu % (micro * 2) == 0:
        micro *= 2
    return BatchPlan(micro_batch_size=micro, accumulation=per_gpu // micro, gpus=gpus,
                     global_batch_size=global_batch_size, states_gib=states,
                     activations_gib_per_seq=per_seq / GIB, gpu_memory_gib=gpu_memory_gib)
