"""Speed applied to a built model from outside (torchtitan's ``parallelize(model, cfg)``).

The model files know nothing of speed. A module that can recompute its layers has a
``gradient_checkpointing`` flag, an encoder that can run on its real tokens an ``unpad`` flag, an
attention module a ``varlen_backend`` name, and every family lists its repeated blocks
(``transformer_layers()``). :func:`apply_speed_options` sets those and swaps modules, in
torchtitan's order:

    activation checkpointing -> CPU kernels -> partial last layer -> unpadding and attention
    kernel -> regional compile -> (the runner, after this) FSDP2 sharding or DDP

Compiling before sharding keeps FSDP's hooks outside the compiled graphs. Every swap changes a
module's class to a subclass of its own (as FSDP2's ``fully_shard`` does), so the parameters,
their names and the state dict stay as they were, and so do the outputs (to float rounding).

**CPU kernels** (:func:`use_cpu_kernels`): the cheap dropout mask (``bertforge.ops.dropout``)
for every plain ``nn.Dropout``, and BERT's linear layers followed by an activation computed as
one oneDNN product with the bias and activation as post-operations (``bertforge.ops.linear``).
Each falls back to the plain operator wherever it does not apply (GPUs, autograd for the fused
product, ``torch.compile``).

**The partial last layer** (:func:`use_partial_rows`, BERT). A masked-LM head reads the final states at the masked positions (~15% of the tokens), a
classifier the first token of each sequence. Every layer but the last must run over all tokens
(its outputs are the next layer's keys and values), but the last one can run its queries,
output projection and feed-forward block at the read positions alone; its keys and values still
cover every token, so the values there are the same. In BERT-base pretraining at 128 tokens
this skips most of one layer of twelve, forward and backward.

A forward pre-hook on the task model notes where its heads will read (``masked_positions``, or
``"first"``) on its encoder, whose class becomes :class:`PartialRowsBertModel`, and the
encoder's last layer becomes :class:`PartialRowsLayer`. The encoder's output
then holds the states at those positions only (:class:`RowsOutput`), which is what the heads'
``select`` and ``pooler_output`` give them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertforge.errors import ConfigError
from bertforge.models.bert import (
    ACT2FN,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForSequenceClassification,
    BertIntermediate,
    BertLayer,
    BertModel,
    BertPredictionHeadTransform,
)
from bertforge.models.outputs import BertModelOutput, check_positions
from bertforge.ops.attention import (BACKENDS, Attend, attend, attend_at, queries_at_rows,
                                     resolve_backend)
from bertforge.ops.dropout import Dropout
from bertforge.ops.linear import Linear
from bertforge.ops.unpad import Layout, TokenLayout, batch_layout


@dataclass(frozen=True)
class SpeedOptions:
    """What :func:`apply_speed_options` applies (docs/performance.md)."""

    unpad: bool = False
    """Run the encoders on their real tokens only (``train.unpad``)."""
    attention_backend: str = "auto"
    """Kernel for unpadded tokens (``ops.attention.BACKENDS``; ``train.attention_backend``)."""
    gradient_checkpointing: bool = False
    """Recompute layer activations in backward (``train.gradient_checkpointing``)."""
    compile: bool = False
    """Regional ``torch.compile`` of each transformer block (``train.compile``)."""
    cpu_kernels: bool = True
    """The cheap dropout mask and the linear layers with their activation fused (each falls
    back to the plain operator where it does not apply: GPUs, autograd, compile)."""
    partial_rows: bool = True
    """The encoder's last layer only where the heads read (masked positions, first tokens)."""


def apply_speed_options(model: nn.Module, options: SpeedOptions | None = None,
                        **changes: Any) -> nn.Module:
    """Apply ``options`` (or the defaults, changed by keyword: ``unpad=True``) to ``model`` in
    place and return it."""
    opts = replace(options or SpeedOptions(), **changes)
    set_gradient_checkpointing(model, opts.gradient_checkpointing)
    if opts.cpu_kernels:
        use_cpu_kernels(model)
    if opts.partial_rows:
        use_partial_rows(model)
    set_unpadding(model, opts.unpad, opts.attention_backend)
    if opts.compile:
        compile_layers(model)
    return model


def check_attention_backend(backend: str, device: torch.device, dtype: torch.dtype) -> None:
    """ConfigError naming ``train.attention_backend`` when ``device`` has no kernel of that
    backend for ``dtype`` (called before the model is built)."""
    try:
        resolve_backend(backend, device, dtype)
    except ValueError as exc:
        raise ConfigError(f"train.attention_backend={backend}: {exc}") from None


def set_gradient_checkpointing(model: nn.Module, enabled: bool = True) -> None:
    """Recompute layer activations in backward instead of storing them (training only): every
    stack of ``model`` that supports it (a module with a ``gradient_checkpointing`` flag)."""
    for module in model.modules():
        if hasattr(module, "gradient_checkpointing"):
            module.gradient_checkpointing = enabled


def set_unpadding(model: nn.Module, enabled: bool = True, backend: str = "auto") -> None:
    """Run the encoders of ``model`` on their real tokens only (``bertforge.ops.unpad``): every
    module with an ``unpad`` flag, and ``backend`` (``bertforge.ops.attention.BACKENDS``) for
    the attention kernels of unpadded tokens (modules with a ``varlen_backend``)."""
    if backend not in BACKENDS:
        raise ValueError(f"attention backend {backend!r} is not one of {', '.join(BACKENDS)}")
    for module in model.modules():
        if hasattr(module, "unpad"):
            module.unpad = enabled
        if hasattr(module, "varlen_backend"):
            module.varlen_backend = backend


def compiles(setting: bool | None, device: torch.device) -> bool:
    """Whether ``train.compile`` = ``setting`` compiles on ``device``: None (the default) means
    on for GPUs, off for CPUs (docs/performance.md, "torch.compile")."""
    return bool(setting) if setting is not None else device.type == "cuda"


def compile_layers(model: nn.Module, **options: Any) -> None:
    """``torch.compile`` each of ``model.transformer_layers()`` in place (regional compilation):
    one graph serves every layer of a stack, so compiling costs seconds, not minutes, and the
    weights keep their names. Dynamic shapes from the start: sizes that vary between batches
    (unpadded token counts, batch widths) are symbols, sizes fixed by the weights are
    specialised by the first trace, so no later shape recompiles. ``options`` go to
    ``torch.compile``."""
    for block in model.transformer_layers():
        block.compile(**{"dynamic": True, **options})


# ---------------------------------------------------------------------------- CPU kernels
def _activation_name(function: object) -> str:
    return next(name for name, f in ACT2FN.items() if f is function)


class FusedIntermediate(BertIntermediate):
    """``BertIntermediate`` with its dense layer and activation as one fused product."""

    activation: str

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dense(hidden, self.activation)


class FusedHeadTransform(BertPredictionHeadTransform):
    """``BertPredictionHeadTransform`` with its dense layer and activation fused."""

    activation: str

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(hidden, self.activation))


FUSED = {BertIntermediate: (FusedIntermediate, "intermediate_act_fn"),
         BertPredictionHeadTransform: (FusedHeadTransform, "transform_act_fn")}
"""Module class -> (its fused subclass, the attribute holding its activation function)."""


def use_cpu_kernels(model: nn.Module) -> None:
    """Swap the kernels into ``model`` in place (a second call changes nothing)."""
    for module in model.modules():
        if type(module) is nn.Dropout:
            module.__class__ = Dropout
        fused = FUSED.get(type(module))
        if fused is not None:
            cls, act = fused
            module.dense.__class__ = Linear
            module.activation = _activation_name(getattr(module, act))
            module.__class__ = cls


# ---------------------------------------------------------------------------- partial last layer
OnlyAt = str | torch.Tensor | None
"""Where the final states are computed: None (every token), ``"first"`` (each sequence's first
token) or a head's positions, a (B, S) bool mask or ascending flat positions."""

READS: dict[type, str] = {BertForPreTraining: "predicted", BertForMaskedLM: "predicted",
                          BertForSequenceClassification: "first", BertForMultipleChoice: "first"}
"""Task model class -> where its heads read the final states: "predicted" (the
``masked_positions`` argument, plus the first tokens when the encoder has a pooler) or "first"."""


def at_rows(hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(..., H) states flattened to (tokens, H), at ``rows`` -> (K, H)."""
    return hidden.flatten(0, -2).index_select(0, rows)


class RowsOutput(BertModelOutput):
    """Encoder outputs of a pass that computed the final states only at ``only_at``: ``select``
    (of that same tensor) and ``pooler_output``, no ``last_hidden_state``."""

    def __init__(self, pooler_output: torch.Tensor | None, at: torch.Tensor, only_at: OnlyAt) -> None:
        self.states = self.layout = self._padded = None
        self.pooler_output, self.at, self.only_at = pooler_output, at, only_at

    @property
    def last_hidden_state(self) -> torch.Tensor:
        raise ValueError("this pass computed the final states only where the heads read them; "
                         "call the model's encoder directly for every token's")

    def select(self, masked_positions: torch.Tensor | None) -> torch.Tensor:
        if masked_positions is not self.only_at:
            raise ValueError("this pass computed the final states only at the heads' positions: "
                             "select those (the same tensor)")
        return self.at


class PartialRowsLayer(BertLayer):
    """``BertLayer`` that can compute its output at some rows only (``rows``: ascending
    indices into the states flattened to (tokens, H))."""

    def forward(self, hidden: torch.Tensor, where: Attend,  # type: ignore[override]
                rows: torch.Tensor | None = None) -> torch.Tensor:
        if rows is None:
            return super().forward(hidden, where)
        att, sa = self.attention, self.attention.self
        x = att.output.normalize_input(hidden)
        p = sa.dropout_p if self.training else 0.0
        k, v = sa.heads(sa.key, x), sa.heads(sa.value, x)
        if queries_at_rows(where, sa.varlen_backend, x.device, x.dtype, sa.head_dim):
            q = sa.heads(sa.query, at_rows(x, rows))
            context = attend_at(q, k, v, where, rows, p, sa.varlen_backend).flatten(-2)
        else:
            q = sa.heads(sa.query, x)
            context = at_rows(attend(q, k, v, where, p, sa.varlen_backend).flatten(-2), rows)
        hidden = att.output(context, at_rows(hidden, rows))                   # (K, H)
        return self.output(self.intermediate(self.output.normalize_input(hidden)), hidden)


class PartialRowsBertModel(BertModel):
    """``BertModel`` whose pass computes the final states only where ``read_at`` (set by the
    task model's hook, consumed by one pass) says."""

    read_at: OnlyAt = None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> BertModelOutput:
        only_at, self.read_at = self.read_at, None
        if only_at is None:
            return super().forward(input_ids, attention_mask, token_type_ids, position_ids, layout)
        where = batch_layout(input_ids, attention_mask, position_ids, layout, unpad=self.unpad)
        self.embeddings.check_length(input_ids.shape[-1])
        hidden = self.embeddings(where.enter(input_ids), where.enter(token_type_ids),
                                 where.positions)                 # (B, S, H) or (T, H)
        rows, firsts, order = self._rows(where, only_at, hidden.device)
        encoder = self.encoder
        recompute = encoder.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for i, layer in enumerate(encoder.layer):
            args = (hidden, where.attend) + ((rows,) if i == len(encoder.layer) - 1 else ())
            hidden = checkpoint(layer, *args, use_reentrant=False) if recompute else layer(*args)
        if hasattr(encoder, "final_layer_norm"):
            hidden = encoder.final_layer_norm(hidden)                    # (K, H)
        if order is not None:
            hidden = hidden.index_select(0, order)
        pooled = self.pooler(hidden[:firsts]) if self.pooler is not None else None
        return RowsOutput(pooled, hidden if isinstance(only_at, str) else hidden[firsts:], only_at)

    def _rows(self, where: Layout, only_at: str | torch.Tensor,
              device: torch.device) -> tuple[torch.Tensor, int, torch.Tensor | None]:
        """The ascending rows of the states ``only_at`` needs; how many of them, first in the
        output, are the sequences' first tokens; the order that puts the output so (or None)."""
        first = where.first_rows(device)
        if isinstance(only_at, str):
            return first, first.shape[0], None
        check_positions(only_at, where.shape)
        picked = where.rows_of(only_at)
        if self.pooler is None:
            return picked, 0, None
        rows, order = torch.cat([first, picked]).sort()
        return rows, first.shape[0], torch.argsort(order)


def _note_reads(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    """Forward pre-hook of a task model: where its heads will read, for its encoder's pass."""
    if module.last_layer_at == "first":
        at: OnlyAt = "first"
    else:  # forward(input_ids, attention_mask, token_type_ids, masked_positions, ...)
        at = kwargs.get("masked_positions", args[3] if len(args) > 3 else None)
    module.bert.read_at = at


def use_partial_rows(model: nn.Module) -> None:
    """Give every task model in ``model`` whose heads read a few positions (``READS``) the
    partial last layer (a second call changes nothing)."""
    for module in model.modules():
        read = READS.get(type(module))
        if read is None or type(module.bert) is not BertModel:
            continue
        module.bert.__class__ = PartialRowsBertModel
        module.bert.encoder.layer[-1].__class__ = PartialRowsLayer
        module.last_layer_at = read
        module.register_forward_pre_hook(_note_reads, with_kwargs=True)


def read_positions(model: nn.Module) -> str | None:
    """Where ``model``'s last layer runs (``bertforge.train.flops.read_tokens``): None (every
    token), "first" or "predicted"."""
    return getattr(model, "last_layer_at", None)


__all__ = ["FUSED", "READS", "FusedHeadTransform", "FusedIntermediate",
           "PartialRowsBertModel", "PartialRowsLayer", "RowsOutput", "SpeedOptions", "at_rows",
           "apply_speed_options", "check_attention_backend", "compile_layers", "compiles",
           "read_positions", "set_gradient_checkpointing", "set_unpadding", "use_cpu_kernels",
           "use_partial_rows"]
