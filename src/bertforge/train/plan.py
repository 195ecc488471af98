"""Propose micro-batch size and gradient accumulation for a GPU set-up.

An estimate, not a measurement: memory per GPU = model states + activations per sequence x
micro-batch, with the sizes the model family's record gives (``FamilySpec.shape``: parameters,
width, layers, vocabulary; no config field is read here). Model states with mixed precision and
LAMB/Adam: fp32 weights, fp32 gradients and two fp32 moments = 16 bytes per parameter.
Activations per layer per sequence, 16-bit, without recomputation and with a fused (flash)
attention kernel: about 34 x S x H bytes (Korthikanti et al., 2022, without the 5 x heads x S^2
term that fused attention does not store); doubled for fp32. A decoder layer (BART) also stores
its cross-attention: about 46 x S x H (``ModelShape.activation_bytes_per_token``). The output
layer: an encoder's masked positions' logits (its sparse head), an encoder-decoder's every
target token's. Use `bertforge pretrain --benchmark` to check the proposal on the real machine.

Learning rate: a published recipe's value where the global batch is that recipe's (LAMB: NVIDIA's
6e-3 at 65536 and 4e-3 at 32768 for BERT, 6e-3 at 64000 and 4e-3 at 30720 for BART; Adam(W):
1e-4 at 256, the BERT paper); elsewhere, square-root scaling with the global batch (the rule under
which LAMB was shown to keep accuracy as the batch grows, You et al., 2020) from the published
point nearest in batch size. The published phase-2 values sit a few percent below the rule's
(4e-3 at 32768 where scaling 65536's 6e-3 gives 4.24e-3): the recipes were tuned, the rule is
not. AdamW is not advised far beyond a few thousand sequences: that is the regime LAMB was made
for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bertforge.errors import ConfigError

if TYPE_CHECKING:  # the module stays cheap to import: the registry loads in plan_batch
    from bertforge.models.shapes import ModelShape

GIB = 2**30
_RESERVED_GIB = 2.0     # CUDA context, allocator slack, NCCL buffers
_USABLE = 0.85          # leave headroom for fragmentation
# Published (global batch, peak learning rate, where, model family) points of each optimizer.
LR_REFERENCE = {
    "lamb": ((65536, 6e-3, "NVIDIA's BERT phase 1", "bert"),
             (32768, 4e-3, "NVIDIA's BERT phase 2", "bert"),
             (64000, 6e-3, "NVIDIA's BART phase 1", "bart"),
             (30720, 4e-3, "NVIDIA's BART phase 2", "bart")),
    "adamw": ((256, 1e-4, "the BERT paper", "bert"),),
}
_ADAMW_MAX_BATCH = 8192  # beyond this, the proposal advises LAMB
_GPUS_PER_NODE = 8       # the launch command's node layout when the GPUs exceed one node


def lr_proposal(optimizer: str, global_batch_size: int,
                family: str = "bert") -> tuple[float, str]:
    """Peak learning rate for ``optimizer`` ("lamb" or "adamw") at ``global_batch_size`` and
    why: a published recipe's value at its own batch size, else the nearest published point
    (in log batch size; the model ``family``'s own points when it has some) scaled by
    sqrt(global batch / its batch)."""
    if optimizer not in LR_REFERENCE:
        raise ConfigError(f"optimizer {optimizer!r}: choose one of {', '.join(LR_REFERENCE)}")
    if global_batch_size < 1:
        raise ConfigError(f"global batch size must be >= 1, got {global_batch_size}")
    points = ([p for p in LR_REFERENCE[optimizer] if p[3] == family]
              or list(LR_REFERENCE[optimizer]))
    batch, lr, where, _ = min(points, key=lambda p: abs(math.log(global_batch_size / p[0])))
    if batch == global_batch_size:
        return lr, f"{where}'s value at this batch"
    return (lr * math.sqrt(global_batch_size / batch),
            f"square-root scaling from {where}'s {lr:.1e} at {batch}")


def proposed_lr(optimizer: str, global_batch_size: int, family: str = "bert") -> float:
    """The learning rate of :func:`lr_proposal`."""
    return lr_proposal(optimizer, global_batch_size, family)[0]


@dataclass
class BatchPlan:
    micro_batch_size: int
    accumulation: int
    gpus: int
    global_batch_size: int
    states_gib: float
    activations_gib_per_seq: float
    gpu_memory_gib: float
    model: str = "bert-large-uncased"
    seq_len: int = 128
    precision: str = "bf16"
    family: str = "bert"

    @property
    def estimated_gib(self) -> float:
        return self.states_gib + self.micro_batch_size * self.activations_gib_per_seq

    def summary(self) -> str:
        return "\n".join([
            f"global batch {self.global_batch_size} = micro-batch {self.micro_batch_size} "
            f"x {self.gpus} GPU{'s' * (self.gpus > 1)} x {self.accumulation} accumulation "
            f"step{'s' * (self.accumulation > 1)}",
            f"estimated memory per GPU: {self.estimated_gib:.1f} of {self.gpu_memory_gib:.0f} GiB "
            f"(model states {self.states_gib:.1f} GiB, activations "
            f"{self.activations_gib_per_seq * 1024:.0f} MiB per sequence)",
            f"config: --train.global_batch_size={self.global_batch_size} "
            f"--train.micro_batch_size={self.micro_batch_size}",
            self.lr_line(),
            f"run (DATA: your `bertforge prepare --max-seq-length {self.seq_len}` output):\n"
            f"  {self.command()}",
        ])

    def lr_line(self) -> str:
        """The learning-rate proposal for both optimizers (see the module docstring)."""
        (lamb, why_lamb), (adamw, why_adamw) = (
            lr_proposal(name, self.global_batch_size, self.family) for name in ("lamb", "adamw"))
        note = ("" if self.global_batch_size <= _ADAMW_MAX_BATCH else
                "; AdamW is not advised at this batch size: use LAMB")
        return (f"learning rate: --optim.name=lamb --optim.lr={lamb:.2e} ({why_lamb}), or "
                f"--optim.name=adamw --optim.lr={adamw:.2e} ({why_adamw}{note})")

    def command(self) -> str:
        """A ready-to-run launch of this plan: torchrun on one node, or on several with the
        GPUs split over nodes of 8 (a c10d rendezvous on $HEAD), with the shipped recipe of the
        family, size and phase (seq 512: phase 2), the model named when it is another."""
        import yaml

        from bertforge.recipes import list_recipes, resolve_recipe

        size = "large" if "large" in self.model else "base"
        phase = 2 if self.seq_len >= 512 else 1
        recipe = f"pretrain/{self.family}-{size}-phase{phase}"
        if recipe not in list_recipes("pretrain"):
            recipe = f"pretrain/bert-base-phase{phase}"
        own = yaml.safe_load(resolve_recipe(recipe).read_text(encoding="utf-8")).get("model")
        if own != self.model:
            recipe += f" --model={self.model}"
        lamb = proposed_lr("lamb", self.global_batch_size, self.family)
        if self.gpus <= _GPUS_PER_NODE:
            launch = f"torchrun --nproc_per_node={self.gpus}"
        else:
            nodes = -(-self.gpus // _GPUS_PER_NODE)
            launch = (f"torchrun --nnodes={nodes} --nproc_per_node={self.gpus // nodes} "
                      "--rdzv_backend=c10d --rdzv_endpoint=$HEAD:29500")
        return (f"{launch} -m bertforge.cli pretrain --config {recipe} --data.path=DATA "
                f"--train.global_batch_size={self.global_batch_size} "
                f"--train.micro_batch_size={self.micro_batch_size} --optim.name=lamb "
                f"--optim.lr={lamb:.2e} --precision={self.precision}")


def plan_batch(*, model: str, seq_len: int, gpus: int, gpu_memory_gib: float,
               global_batch_size: int, precision: str = "bf16",
               max_predictions: int | None = None) -> BatchPlan:
    from bertforge.models.registry import resolve_config

    if gpus < 1 or global_batch_size < 1 or gpu_memory_gib <= 0 or seq_len < 1:
        raise ConfigError(f"gpus ({gpus}), global batch size ({global_batch_size}), GPU memory "
                          f"({gpu_memory_gib} GiB) and sequence length ({seq_len}) must be positive")
    if global_batch_size % gpus:
        raise ConfigError(f"global batch size {global_batch_size} is not divisible by {gpus} GPUs")
    family, cfg = resolve_config(model)
    shape = family.model_shape(cfg)
    if seq_len > shape.positions:
        raise ConfigError(f"sequence length {seq_len} exceeds {model}'s max_position_embeddings "
                          f"({shape.positions}); plan for at most that many tokens")
    act_bytes = 2 if precision in ("bf16", "fp16") else 4
    per_seq = _activation_bytes(shape, seq_len, act_bytes, max_predictions)
    states = 16 * shape.parameters / GIB
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
                     activations_gib_per_seq=per_seq / GIB, gpu_memory_gib=gpu_memory_gib,
                     model=model, seq_len=seq_len, precision=precision,
                     family=family.model_types[0])


def _activation_bytes(shape: ModelShape, seq_len: int, act_bytes: int,
                      max_predictions: int | None) -> float:
    """Activation bytes one training sequence stores (see the module docstring): its layers,
    and the logits of an encoder's masked positions (15% of the tokens unless
    ``max_predictions``) or of an encoder-decoder's every target token (as long as the
    source)."""
    layers = seq_len * shape.activation_bytes_per_token(act_bytes)
    if shape.decoder is not None:
        scored = seq_len
    else:
        scored = max_predictions if max_predictions is not None else max(1, round(0.15 * seq_len))
    return layers + scored * shape.vocab * (act_bytes + 4)
