"""FLOP counts for MFU, counted from the model's shapes (not measured).

One formula for every family, fed by the family's ``ModelShape`` (``bertforge.models.shapes``,
named by its ``FamilySpec.shape``): width H, vocabulary V, per stack its layers, feed-forward
width I, whether the feed-forward block is gated, and each layer's attention window.
A matmul of (m x k) by (k x n) costs 2mkn FLOPs. Per sequence of S tokens, forward:
  encoder, per layer: QKV and output projections 8SH^2; feed-forward 4SHI (a gated GeGLU block,
                       input projection H -> 2I: 6SHI); attention scores and weighted sum 4H
                       per (query, key) pair the layer scores: S^2 in a global layer, the pairs
                       with |i - j| <= w in a sliding-window layer (``window_pairs``: about
                       2w + 1 keys per query, S^2 when the window covers the sequence);
  pooler 2H^2 and NSP head 4H (families with an NSP head, when the objective uses it);
  MLM head at P predicted positions: transform 2PH^2 (where the head has one) and decoder 2PHV
                       (only at masked positions when the model computes logits there; P = S
                       otherwise).
A model whose heads read only some final states (a classifier the first token's, MLM the
masked positions') and whose family can run its last layer there alone (``BertModel.forward``'s
``only_at``) runs that layer's queries, output projection and feed-forward block only there:
the layer then costs 4SH^2 (keys and values) + Q(4H^2 + 4HI + 4SH) for its Q computed tokens,
and is counted so.
Training = 3 x forward (backward costs two matmuls per forward matmul). Embedding lookups,
layer norms, softmax and activations are not counted, as is usual for MFU.

Encoder-decoder (BART), per pair of an S-token source and a T-token target, forward:
  encoder, per layer: as above;
  decoder, per layer: self-attention 8TH^2 + 4T^2H (the causal half that a kernel may skip is
                       counted, as is usual), cross-attention 4TH^2 (Q and output projections)
                       + 4SH^2 (K and V of the encoder output) + 4TSH, feed-forward 4THI;
  LM head at the P scored target positions: 2PHV.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import torch

from bertforge.models.registry import shape_of
from bertforge.models.shapes import ModelShape, Stack
from bertforge.ops.unpad import TokenLayout

# Dense (no sparsity) tensor-core peak per GPU in FLOP/s, from the vendors' data sheets: bf16 and
# fp16, and TF32 for "fp32" (what fp32 matmuls run as on these GPUs inside bertforge's runs).
# The same chip comes in forms with other clocks and power limits, so the most specific name
# comes first: "NVIDIA H100 PCIe" and "NVIDIA H100 NVL" are not the SXM part "NVIDIA H100 80GB
# HBM3". Matched as whole words of ``torch.cuda.get_device_name``.
_PEAK: tuple[tuple[str, dict[str, float]], ...] = (
    (r"H100\b.*\bPCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 378e12}),
    (r"H100\b.*\bNVL", {"bf16": 835e12, "fp16": 835e12, "fp32": 417.5e12}),
    (r"H200\b.*\bNVL", {"bf16": 835e12, "fp16": 835e12, "fp32": 417.5e12}),
    (r"GH200", {"bf16": 989e12, "fp16": 989e12, "fp32": 494.5e12}),
    (r"H100", {"bf16": 989e12, "fp16": 989e12, "fp32": 494.5e12}),   # SXM (HBM3)
    (r"H200", {"bf16": 989e12, "fp16": 989e12, "fp32": 494.5e12}),   # SXM
    (r"A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12}),
    (r"L40S", {"bf16": 362e12, "fp16": 362e12, "fp32": 183e12}),
    (r"L40", {"bf16": 181e12, "fp16": 181e12, "fp32": 90.5e12}),
    (r"L4", {"bf16": 121e12, "fp16": 121e12, "fp32": 60e12}),
    (r"A10", {"bf16": 125e12, "fp16": 125e12, "fp32": 62.5e12}),
    (r"V100\b.*\bPCIe", {"fp16": 112e12, "fp32": 14e12}),
    (r"V100", {"fp16": 125e12, "fp32": 15.7e12}),
)


def window_pairs(seq_len: int, window: int) -> int:
    """(query, key) pairs of one ``seq_len``-token sequence with ``|i - j| <= window``: what a
    sliding-window layer scores (``seq_len ** 2`` when the window covers the sequence)."""
    if seq_len - 1 <= window:
        return seq_len * seq_len
    # every query sees 2w + 1 keys, less the w(w + 1) / 2 cut off at each end of the sequence
    return seq_len * (2 * window + 1) - window * (window + 1)


def _layer(hidden: int, seq_len: float, ffn: int, pairs: float, queries: float) -> float:
    """Forward FLOPs of one layer: keys and values of ``seq_len`` tokens, queries, output
    projection and feed-forward block (``ffn`` FLOPs per token) at ``queries`` tokens, 4H per
    scored (query, key) pair."""
    h = hidden
    return 4 * seq_len * h * h + queries * (4 * h * h + ffn) + 4 * h * pairs


def encoder_flops(stack: Stack, hidden: int, seq_len: float, windowed: bool = True,
                  last_queries: float | None = None) -> float:
    """Forward FLOPs of an encoder ``stack`` over one ``seq_len``-token sequence (see the module
    docstring); ``windowed=False`` scores sliding-window layers as global (what a dense masked
    kernel computes); ``last_queries``: the tokens the last layer runs its queries for (None:
    every token)."""
    s, ffn = seq_len, (6 if stack.glu else 4) * hidden * stack.intermediate
    layers = stack.layer_windows()
    if last_queries is not None:
        last = stack.windows[-1] if stack.windows else None
        layers[last] -= 1
        keys = s if last is None or not windowed else min(s, 2 * last + 1)
        total = _layer(hidden, s, ffn, last_queries * keys, last_queries)
    else:
        total = 0
    for window, count in layers.items():
        pairs = s * s if window is None or not windowed else window_pairs(s, window)
        total += count * _layer(hidden, s, ffn, pairs, s)
    return total


def train_flops(shape: ModelShape, seq_len: float, predictions: float, *, nsp: bool = False,
                windowed: bool = True, last_queries: float | None = None) -> float:
    """Training FLOPs (forward + backward) of one sequence of an encoder of ``shape``: its
    layers (:func:`encoder_flops`), its MLM head at ``predictions`` positions, and the pooler
    and NSP head when ``nsp`` and the shape has them."""
    h = shape.hidden
    heads = 2 * predictions * h * shape.vocab
    if shape.lm_transform:
        heads += 2 * predictions * h * h
    if nsp and shape.nsp_head:
        heads += 2 * h * h + 4 * h
    return 3.0 * (encoder_flops(shape.encoder, h, seq_len, windowed, last_queries) + heads)


def bert_train_flops(*, layers: int, hidden: int, intermediate: int, vocab: int, seq_len: float,
                     predictions: float, nsp: bool, last_queries: float | None = None) -> float:
    """:func:`train_flops` of a BERT of these sizes. ``last_queries``: the tokens the last layer
    runs its queries, output projection and feed-forward block for (its keys and values cover
    all ``seq_len``), when a model computes its final states only where a head reads them
    (``BertModel.forward``'s ``only_at``); None: every token."""
    shape = ModelShape(hidden=hidden, vocab=vocab, encoder=Stack(layers, intermediate),
                       parameters=0, positions=0, nsp_head=True, partial_last_layer=True)
    return train_flops(shape, seq_len, predictions, nsp=nsp, last_queries=last_queries)


def modernbert_train_flops(*, hidden: int, intermediate: int, vocab: int,
                           global_layers: Sequence[bool], window: int, seq_len: int,
                           predictions: float, windowed: bool = True) -> float:
    """:func:`train_flops` of a ModernBERT of these sizes (GeGLU feed-forward, no NSP head);
    ``global_layers``: per layer, whether it attends globally, else within ``window``."""
    stack = Stack(len(global_layers), intermediate, glu=True,
                  windows=tuple(None if g else window for g in global_layers))
    shape = ModelShape(hidden=hidden, vocab=vocab, encoder=stack, parameters=0, positions=0)
    return train_flops(shape, seq_len, predictions, windowed=windowed)


def read_tokens(read: str | None, predictions: float, nsp: bool) -> float | None:
    """The tokens a model's last layer computes (:func:`encoder_flops`'s ``last_queries``)
    when its heads read ``read`` (a model class's ``last_layer_at``): None (every token),
    ``"first"`` (each sequence's first) or ``"predicted"`` (the MLM positions, and the first
    token for the NSP head)."""
    if read is None:
        return None
    return 1.0 if read == "first" else predictions + (1.0 if nsp else 0.0)


def sequence_flops(config, nsp: bool = False, windowed: bool = True,
                   read: str | None = None) -> Callable[[int, float], float]:
    """(real length, MLM predictions) -> training FLOPs of one sequence of an encoder of
    ``config`` (its family's ``ModelShape``): ``nsp`` counts the NSP head where the family has
    one, ``windowed`` sliding-window layers as such, ``read`` (:func:`read_tokens`) the last
    layer at the tokens the heads read where the family can run it there alone."""
    shape = shape_of(config)
    if shape.decoder is not None:
        raise ValueError(f"{type(config).__name__} is an encoder-decoder: count it with "
                         "seq2seq_train_flops")
    nsp = nsp and shape.nsp_head
    read = read if shape.partial_last_layer else None
    return lambda s, p: train_flops(shape, s, p, nsp=nsp, windowed=windowed,
                                    last_queries=read_tokens(read, p, nsp))


def batch_train_flops(config, attention_mask: torch.Tensor,
                      predicted: torch.Tensor | None = None, nsp: bool = False,
                      layout: TokenLayout | None = None, windowed: bool = True,
                      read: str | None = None) -> float:
    """Training FLOPs of one micro-batch from its CPU tensors (no device sync): one sequence per
    row of ``attention_mask`` ((B, S), or (B, C, S) for multiple choice: B*C sequences), or per
    sequence of ``layout`` (packed rows), at its real length, with the True entries of
    ``predicted`` (same shape as the mask) as its MLM positions (none without). The count
    follows ``config``'s family (:func:`sequence_flops`)."""
    if layout is None:
        lengths = attention_mask.reshape(-1, attention_mask.shape[-1]).sum(-1).tolist()
        preds = ([0] * len(lengths) if predicted is None else
                 predicted.reshape(-1, predicted.shape[-1]).sum(-1).tolist())
    else:
        lengths = layout.lengths().tolist()
        preds = [0] * len(lengths)
        if predicted is not None:
            per_token = predicted.reshape(-1).index_select(0, layout.indices).long()
            sequence = layout.sequence_of_token()
            preds = torch.zeros(len(lengths), dtype=torch.long).index_add_(
                0, sequence, per_token).tolist()
    flops = sequence_flops(config, nsp, windowed, read)
    return sum(flops(s, p) for s, p in zip(lengths, preds))


def decoder_flops(stack: Stack, hidden: int, target_len: int, source_len: int) -> float:
    """Forward FLOPs of a decoder ``stack`` over a ``target_len``-token target attending to a
    ``source_len``-token source (see the module docstring)."""
    h, t, s = hidden, target_len, source_len
    ffn = (6 if stack.glu else 4) * h * stack.intermediate
    self_attention = 8 * t * h * h + 4 * t * t * h
    cross_attention = 4 * t * h * h + 4 * s * h * h + 4 * t * s * h
    return stack.layers * (self_attention + cross_attention + ffn * t)


def seq2seq_train_flops(config, source_lengths: torch.Tensor,
                        target_lengths: torch.Tensor) -> float:
    """Training FLOPs of a micro-batch of encoder-decoder pairs of ``config`` (its family's
    ``ModelShape``): real source and target lengths per row (CPU tensors, no device sync),
    every target token scored."""
    shape = shape_of(config)
    if shape.decoder is None:
        raise ValueError(f"{type(config).__name__} has no decoder: count it with "
                         "batch_train_flops")
    h, total = shape.hidden, 0.0
    for s, t in zip(source_lengths.tolist(), target_lengths.tolist()):
        head = 2 * t * h * shape.vocab + (2 * t * h * h if shape.lm_transform else 0)
        total += 3.0 * (encoder_flops(shape.encoder, h, s) + decoder_flops(shape.decoder, h, t, s)
                        + head)
    return total

def peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's peak FLOP/s for ``precision``, or None when unknown (CPUs, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    return peak_for_name(torch.cuda.get_device_name(device), precision)


def peak_for_name(name: str, precision: str) -> float | None:
    """Peak FLOP/s of the GPU called ``name`` (as CUDA reports it) for ``precision``; None for
    a GPU not in the table or a precision it has no tensor cores for."""
    for pattern, table in _PEAK:
        if re.search(rf"\b{pattern}\b", name, re.IGNORECASE):
            return table.get(precision) or None
    return None
