"""FLOP counts for MFU, counted from the model's shapes (not measured).

A matmul of (m x k) by (k x n) costs 2mkn FLOPs. Per sequence of S tokens, forward:
  encoder, per layer: QKV and output projections 8SH^2, feed-forward 4SHI, attention scores and
                       weighted sum 4S^2H (QK^T and PV);
  pooler 2H^2 and NSP head 4H (NSP models only);
  MLM head at P predicted positions: transform 2PH^2 and decoder 2PHV (only at masked positions
                       when the model computes logits there; P = S otherwise).
A model whose heads read only some final states (a classifier the first token's, MLM the
masked positions') runs its last layer's queries, output projection and feed-forward block only
there (``BertModel.forward``'s ``only_at``): that layer then costs 4SH^2 (keys and values) +
Q(4H^2 + 4HI + 4SH) for its Q computed tokens, and is counted so.
Training = 3 x forward (backward costs two matmuls per forward matmul). Embedding lookups,
layer norms, softmax and activations are not counted, as is usual for MFU.

Encoder-decoder (BART), per pair of an S-token source and a T-token target, forward:
  encoder, per layer: 8SD^2 + 4SDF_enc + 4S^2D, as above;
  decoder, per layer: self-attention 8TD^2 + 4T^2D (the causal half that a kernel may skip is
                       counted, as is usual), cross-attention 4TD^2 (Q and output projections)
                       + 4SD^2 (K and V of the encoder output) + 4TSD, feed-forward 4TDF_dec;
  LM head at the P scored target positions: 2PDV.

ModernBERT (``config.model_type == "modernbert"``), per sequence of S tokens, forward:
  per layer: Wqkv 6SH^2 and Wo 2SH^2 (8SH^2, as BERT), GeGLU feed-forward Wi (H -> 2I) 4SHI and
             Wo (I -> H) 2SHI (6SHI in all); attention 4H per (query, key) pair the layer
             scores: S^2 pairs in a global layer, the pairs with |i - j| <= w in a
             sliding-window layer (w = local_attention // 2: S(2w + 1) - w(w + 1) pairs once
             S > w + 1, i.e. about 2w + 1 keys per query; S^2 when the window covers the
             sequence);
  MLM head at the P masked positions: dense 2PH^2 and decoder 2PHV (no pooler, no NSP).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import torch

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


def bert_train_flops(*, layers: int, hidden: int, intermediate: int, vocab: int, seq_len: float,
                     predictions: float, nsp: bool, last_queries: float | None = None) -> float:
    """Training FLOPs for one sequence (forward + backward). ``last_queries``: the tokens the
    last layer runs its queries, output projection and feed-forward block for (its keys and
    values cover all ``seq_len``), when a model computes its final states only where a head
    reads them (``BertModel.forward``'s ``only_at``); None: every token."""
    h, s = hidden, seq_len
    q = s if last_queries is None else last_queries
    layer = 8 * s * h * h + 4 * s * h * intermediate + 4 * s * s * h
    last = 4 * s * h * h + 4 * q * h * h + 4 * q * h * intermediate + 4 * q * s * h
    encoder = (layers - 1) * layer + last
    heads = 2 * predictions * h * h + 2 * predictions * h * vocab
    if nsp:
        heads += 2 * h * h + 4 * h
    return 3.0 * (encoder + heads)


def window_pairs(seq_len: int, window: int) -> int:
    """(query, key) pairs of one ``seq_len``-token sequence with ``|i - j| <= window``: what a
    sliding-window layer scores (``seq_len ** 2`` when the window covers the sequence)."""
    if seq_len - 1 <= window:
        return seq_len * seq_len
    # every query sees 2w + 1 keys, less the w(w + 1) / 2 cut off at each end of the sequence
    return seq_len * (2 * window + 1) - window * (window + 1)


def modernbert_train_flops(*, hidden: int, intermediate: int, vocab: int,
                           global_layers: Sequence[bool], window: int, seq_len: int,
                           predictions: float, windowed: bool = True) -> float:
    """Training FLOPs (forward + backward) of one ModernBERT sequence of ``seq_len`` real
    tokens with ``predictions`` MLM positions; ``global_layers``: per layer, whether it attends
    globally. ``windowed=False`` counts the sliding-window layers as global (S^2 pairs: what a
    dense masked kernel computes), for comparison."""
    h, s = hidden, seq_len
    dense = 8 * s * h * h + 6 * s * h * intermediate
    local = window_pairs(s, window) if windowed else s * s
    encoder = sum(dense + 4 * h * (s * s if is_global else local) for is_global in global_layers)
    head = 2 * predictions * h * h + 2 * predictions * h * vocab
    return 3.0 * (encoder + head)


def read_tokens(read: str | None, predictions: float, nsp: bool) -> float | None:
    """The tokens a BERT model's last layer computes (``bert_train_flops``'s ``last_queries``)
    when its heads read ``read`` (a model class's ``last_layer_at``): None (every token),
    ``"first"`` (each sequence's first) or ``"predicted"`` (the MLM positions, and the first
    token for the NSP head)."""
    if read is None:
        return None
    return 1.0 if read == "first" else predictions + (1.0 if nsp else 0.0)


def sequence_flops(config, nsp: bool = False, windowed: bool = True,
                   read: str | None = None) -> Callable[[int, float], float]:
    """(real length, MLM predictions) -> training FLOPs of one sequence, for ``config``'s
    family: ModernBERT (global and sliding-window layers, no NSP head) or BERT (its last layer
    at the tokens ``read``, :func:`read_tokens`)."""
    if getattr(config, "model_type", None) == "modernbert":
        kinds = [kind == "full_attention" for kind in config.resolved_layer_types()]
        return lambda s, p: modernbert_train_flops(
            hidden=config.hidden_size, intermediate=config.intermediate_size,
            vocab=config.vocab_size, global_layers=kinds, window=config.window, seq_len=s,
            predictions=p, windowed=windowed)
    return lambda s, p: bert_train_flops(
        layers=config.num_hidden_layers, hidden=config.hidden_size,
        intermediate=config.intermediate_size, vocab=config.padded_vocab_size, seq_len=s,
        predictions=p, nsp=nsp, last_queries=read_tokens(read, p, nsp))


def batch_train_flops(config, attention_mask: torch.Tensor,
                      predicted: torch.Tensor | None = None, nsp: bool = False,
                      layout: TokenLayout | None = None, windowed: bool = True,
                      read: str | None = None) -> float:
    """Training FLOPs of one micro-batch from its CPU tensors (no device sync): one sequence per
    row of ``attention_mask`` ((B, S), or (B, C, S) for multiple choice: B*C sequences), or per
    sequence of ``layout`` (packed rows), at its real length, with the True entries of
    ``predicted`` (same shape as the mask) as its MLM positions (none without). The count
    follows ``config``'s family (:func:`sequence_flops`; ``windowed``: ModernBERT only;
    ``read``: where a BERT model's last layer runs, its class's ``last_layer_at``)."""
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


def seq2seq_train_flops(config, source_lengths: torch.Tensor,
                        target_lengths: torch.Tensor) -> float:
    """Training FLOPs of a micro-batch of encoder-decoder pairs: real source and target lengths
    per row (CPU tensors, no device sync), every target token scored."""
    d, v = config.d_model, config.vocab_size
    total = 0.0
    for s, t in zip(source_lengths.tolist(), target_lengths.tolist()):
        encoder = config.encoder_layers * (8 * s * d * d + 4 * s * d * config.encoder_ffn_dim
                                           + 4 * s * s * d)
        decoder = config.decoder_layers * (8 * t * d * d + 4 * t * t * d + 4 * t * d * d
                                           + 4 * s * d * d + 4 * t * s * d
                                           + 4 * t * d * config.decoder_ffn_dim)
        total += 3.0 * (encoder + decoder + 2 * t * d * v)
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
