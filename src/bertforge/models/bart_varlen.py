"""BART's decoder on unpadded tokens: causal self-attention within each target, cross-attention
from each target to the real tokens of its own source.

``bertforge.ops.attention`` runs bidirectional attention within the sequences of one layout (the
encoder's). The decoder needs two more variable-length shapes, both here:

* causal self-attention over the decoder's tokens (a ``TokenLayout`` of the targets);
* cross-attention whose queries are the decoder tokens of pair n and whose keys and values are
  the encoder tokens of pair n: two layouts with one sequence per batch row each.

:class:`Seq2SeqLayout` holds both layouts; :func:`causal_attention` and :func:`cross_attention`
pick the kernel by backend (``bertforge.ops.attention.BACKENDS``, resolved as for the encoder):

* ``flash`` / ``torch-flash``: the fused varlen kernel (``bertforge.ops.attention.fused_varlen``)
  with both ``cu_seqlens`` (``causal`` for self-attention);
* ``nested``: SDPA on jagged nested tensors for cross-attention (PyTorch's fused varlen kernels
  on CUDA). Nested tensors refuse ``is_causal``, so self-attention takes the padded kernel;
* ``padded``: the sequences (pairs) of similar lengths gathered into padded rows, one SDPA call
  per group of widths (lengths rounded up to ``bertforge.ops.slots.BUCKET``), gathered back
  (``bertforge.ops.slots``, as the encoder's ``padded`` backend). The fastest on CPU.

The decoder's tokens (:func:`target_layout`) are the first ``length`` columns of each row: through
its last scored position when the loss names them, else every column. Causal attention makes the
states of those columns independent of the columns after them, so they equal the padded decoder's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.ops.attention import FUSED, fused_varlen, nested_heads, resolve_backend, sdpa
from bertforge.ops.slots import Gathering, SlotBuilder, bucket_widths, gather, scatter
from bertforge.ops.unpad import TokenLayout, token_layout


@dataclass
class _Group:
    """Pairs whose targets have the same rounded length: ``rows`` padded rows of ``q_width``
    queries and ``k_width`` keys (their slots follow the previous group's)."""

    rows: int
    q_width: int
    k_width: int
    keep: torch.Tensor | None  # (rows, 1, 1, k_width) key mask; None: nothing to hide


@dataclass
class _Plan:
    groups: list[_Group]
    queries: Gathering | None  # None: the identity (one group, every target row full)
    keys: Gathering | None     # None: the identity; self-attention: ``queries``


@dataclass
class Seq2SeqLayout:
    """Where an unpadded decoder's tokens and their sources are: ``target`` (the decoder's T_t
    tokens) and ``source`` (the encoder's T_s tokens), sequence n of each from batch row n."""

    target: TokenLayout
    source: TokenLayout
    plans: dict = field(default_factory=dict, repr=False, compare=False)
    """The padded kernel's groups, made on first use and shared by every layer."""


def target_layout(shape: tuple[int, int], target_positions: torch.Tensor | None,
                  device: torch.device) -> TokenLayout:
    """The decoder tokens of a (B, T) batch: row b's columns 0 .. through its last scored
    position (``target_positions`` (B, T) bool; at least column 0), or every column."""
    b, t = shape
    columns = torch.arange(t, device=device)
    if target_positions is None:
        return token_layout(torch.ones(b, t, dtype=torch.bool, device=device))
    lengths = torch.where(target_positions, columns + 1, 0).amax(dim=1).clamp_(min=1)  # (B,)
    return token_layout(columns[None, :] < lengths[:, None])


def _plan(q_cu: torch.Tensor, k_cu: torch.Tensor | None, device: torch.device) -> _Plan:
    """Group the pairs by their targets' rounded length (keys: each group's longest source,
    rounded up to 8); ``k_cu`` None: self-attention. Host arithmetic on the lengths (one device
    read for a GPU layout)."""
    q_cu_np = q_cu.cpu().numpy().astype(np.int64)
    q_w = bucket_widths(np.diff(q_cu_np))
    queries = SlotBuilder(q_cu_np)
    keys = None if k_cu is None else SlotBuilder(k_cu.cpu().numpy().astype(np.int64))
    groups = []
    for width in np.unique(q_w).tolist():  # a loop over a handful of widths
        members = np.flatnonzero(q_w == width)
        queries.add(members, width)
        group = _Group(len(members), width, width, None)
        if keys is not None:
            lengths = np.diff(keys.cu)[members]
            group.k_width = int(-(-lengths.max() // 8) * 8)
            keys.add(members, group.k_width)
            if (lengths != group.k_width).any():
                keep = np.arange(group.k_width)[None, :] < lengths[:, None]
                group.keep = torch.as_tensor(keep, device=device)[:, None, None, :]
        groups.append(group)
    q_gathering = queries.build(device)
    return _Plan(groups, q_gathering, q_gathering if keys is None else keys.build(device))


@torch.compiler.disable  # data-dependent layouts: eager between compiled regions
def causal_attention(qkv: torch.Tensor, where: Seq2SeqLayout, dropout_p: float = 0.0,
                     backend: str = "auto") -> torch.Tensor:
    """Causal self-attention within each target: qkv (T_t, 3, heads, head_dim) -> (T_t, heads,
    head_dim)."""
    backend = resolve_backend(backend, qkv.device, qkv.dtype, qkv.shape[-1])
    if backend in FUSED:
        t = where.target
        q, k, v = qkv.unbind(1)
        return fused_varlen(backend, q, k, v, t.cu_seqlens, t.cu_seqlens, t.max_seqlen,
                            t.max_seqlen, dropout_p, causal=True)
    return _grouped_attention(qkv, None, where, dropout_p)


@torch.compiler.disable
def cross_attention(q: torch.Tensor, kv: torch.Tensor, where: Seq2SeqLayout,
                    dropout_p: float = 0.0, backend: str = "auto") -> torch.Tensor:
    """Each target's queries q (T_t, heads, head_dim) over its own source's keys and values kv
    (T_s, 2, heads, head_dim) -> (T_t, heads, head_dim)."""
    backend = resolve_backend(backend, q.device, q.dtype, q.shape[-1])
    t, s = where.target, where.source
    k, v = kv.unbind(1)
    if backend in FUSED:
        return fused_varlen(backend, q, k, v, t.cu_seqlens, s.cu_seqlens, t.max_seqlen,
                            s.max_seqlen, dropout_p)
    if backend == "nested":  # jagged tensors need dense values: k, v are views of kv
        out = F.scaled_dot_product_attention(nested_heads(q.contiguous(), t),
                                             nested_heads(k.contiguous(), s),
                                             nested_heads(v.contiguous(), s), dropout_p=dropout_p)
        return out.transpose(1, 2).values()
    return _grouped_attention(q, kv, where, dropout_p)


def _grouped_attention(q: torch.Tensor, kv: torch.Tensor | None, where: Seq2SeqLayout,
                       dropout_p: float) -> torch.Tensor:
    """The ``padded`` kernel (see the module notes): causal self-attention when ``kv`` is None
    (``q`` then holds queries, keys and values, (T, 3, heads, head_dim)), else cross-attention."""
    cross = kv is not None
    name = "cross" if cross else "self"
    if name not in where.plans:
        where.plans[name] = _plan(where.target.cu_seqlens,
                                  where.source.cu_seqlens if cross else None, q.device)
    plan: _Plan = where.plans[name]
    heads, head_dim = q.shape[-2:]
    # (slots, ...) -> one (rows, width, ...) block per group; split, not slices: its backward
    # is one concatenation where slices would each zero-fill a buffer of every slot
    q_slots = gather(q, plan.queries)
    queries = q_slots.split([g.rows * g.q_width for g in plan.groups])
    keys = queries
    if cross:
        kv_slots = gather(kv, plan.keys)
        keys = kv_slots.split([g.rows * g.k_width for g in plan.groups])
    outputs = []
    for g, query, key in zip(plan.groups, queries, keys):
        if cross:
            query = query.unflatten(0, (g.rows, g.q_width))
            key, value = key.unflatten(0, (g.rows, g.k_width)).unbind(2)
        else:
            query, key, value = query.unflatten(0, (g.rows, g.q_width)).unbind(2)
        context = sdpa(  # (rows, heads, width, head_dim)
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), g.keep, dropout_p,
            is_causal=not cross)
        outputs.append(context.transpose(1, 2).reshape(g.rows * g.q_width, heads, head_dim))
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    return scatter(out, plan.queries)


__all__ = ["Seq2SeqLayout", "causal_attention", "cross_attention", "target_layout"]
