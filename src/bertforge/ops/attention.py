"""Bidirectional attention for either token layout: one entry point, :func:`attend`.

A caller projects its states to queries, keys and values, splits the heads off the last axis
(``x.unflatten(-1, (heads, head_dim))``) and passes the layout's ``attend`` value
(``bertforge.ops.unpad``); this module picks the kernel:

* padded rows, (B, S, heads, head_dim) with a (B, 1, 1 or S, S) bool keep mask or None:
  ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch picks flash, memory-efficient
  or math);
* unpadded tokens, (T, heads, head_dim) with their ``TokenLayout``: a variable-length kernel,
  attention within each sequence (:func:`varlen_attention`), by backend, best first:

  * ``flash``: ``flash_attn.flash_attn_varlen_func`` (the flash-attn package, CUDA, fp16/bf16);
  * ``torch-flash``: the same kind of kernel from PyTorch itself, the varlen flash-attention
    operator its nested-tensor attention calls (``aten::_flash_attention_forward``, with
    autograd), called directly on the packed tokens and ``cu_seqlens``: CUDA compute
    capability 8.0 or newer, fp16/bf16, a head size that is a multiple of 8 up to 256;
  * ``nested``: PyTorch SDPA on nested tensors of the jagged layout, which runs PyTorch's own
    fused varlen kernels on CUDA (flash, memory-efficient or cuDNN attention: no extra
    package). The tensors carry the batch's shortest and longest sequence lengths (host ints
    from the loader), so PyTorch's kernel checks read nothing back from the GPU, but every
    nested-tensor operation is dispatched in Python, per layer, forward and backward. On a CPU
    PyTorch has no fused kernel for them and falls back to a per-sequence math path (it reads
    every length and warns about its strided nested layout): a correctness reference there,
    never the default;
  * ``padded``: the tokens scattered into padded rows, one per *sequence*, sequences of similar
    length together (lengths rounded up to a multiple of ``BUCKET``, one SDPA call per width, a
    key-padding mask where a row is not full), gathered back. Always available; the fastest on
    CPU, where SDPA on nested tensors falls back to a per-sequence loop (measured ~10x slower,
    docs/performance.md).

The result has the shape of ``q``; ``out.flatten(-2)`` merges the heads again.
:func:`attend_at` attends the queries of some tokens only (an encoder's last layer, where the
heads read a few states), over their whole sequences' keys.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.core.limits import ATTENTION_BACKENDS as BACKENDS
from bertforge.core.limits import FUSED_ATTENTION_BACKENDS as FUSED  # one fused_varlen call
from bertforge.ops.dropout import dropout
from bertforge.ops.slots import BUCKET, Gathering, SlotBuilder, bucket_widths, gather, scatter
from bertforge.ops.unpad import TokenLayout

Attend = torch.Tensor | TokenLayout | None
"""What attention reads besides q, k, v: a padded keep mask (or None: every key visible) for
(B, S, heads, head_dim) inputs, or the ``TokenLayout`` of (T, heads, head_dim) inputs."""


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, where: Attend,
           dropout_p: float = 0.0, backend: str = "auto") -> torch.Tensor:
    """Bidirectional attention, within each sequence: q, k, v (B, S, heads, head_dim) with a
    keep mask (True = may attend) or None, or (T, heads, head_dim) with their ``TokenLayout``
    -> the shape of q. ``backend`` (``BACKENDS``) picks the kernel for unpadded tokens."""
    if isinstance(where, TokenLayout):
        return varlen_attention(q, k, v, where, dropout_p, backend)
    # (B, S, heads, head_dim) -> (B, heads, S, head_dim), SDPA's layout, and back
    q, k, v = (x.transpose(-3, -2) for x in (q, k, v))
    return sdpa(q, k, v, where, dropout_p).transpose(-3, -2)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
         dropout_p: float, is_causal: bool = False) -> torch.Tensor:
    """``scaled_dot_product_attention`` in SDPA's layout (``mask``: bool keep mask or an additive
    float bias). On a CPU, bf16/fp16 inputs are attended in fp32 (autocast off) and the result
    is cast back whenever autograd records: PyTorch's CPU attention kernels are slower in half
    precision than in fp32 forward and backward (2.3x slower in bf16 at BERT-mini's shapes, on
    a CPU whose bf16 matrix units make the linear layers 7x faster; docs/performance.md), while
    the matrix products around them keep their half precision. Without autograd (inference)
    and without a float bias, bf16 stays bf16: the forward kernel alone is faster in bf16
    (1.3-1.8x at BERT's shapes, one core). A float bias (BART's, ModernBERT's windows) keeps
    the fp32 detour: its -inf and fp32 extremes do not all survive a cast to bf16.
    With dropout on a CPU (training), where PyTorch has no fused kernel and takes its math
    path, :func:`_cpu_dropout_attention` does that math with the cheap dropout mask."""
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                              is_causal=is_causal)
    dtype = q.dtype
    biased = mask is not None and mask.is_floating_point()
    if dtype == torch.float16 or (dtype == torch.bfloat16 and (torch.is_grad_enabled()
                                                               or biased)):
        q, k, v = q.float(), k.float(), v.float()
        if biased:
            mask = mask.float()
    with torch.autocast("cpu", enabled=False):  # autocast would cast SDPA's inputs back
        if dropout_p > 0.0 and not torch.compiler.is_compiling():
            out = _cpu_dropout_attention(q, k, v, mask, dropout_p, is_causal)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                 is_causal=is_causal)
    return out.to(dtype)


def _cpu_dropout_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           mask: torch.Tensor | None, dropout_p: float,
                           is_causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) with dropout, times v: what SDPA's CPU math path computes
    in training, without its per-call checks for fully masked rows (it zeroes them; here a
    masked key gets the dtype's lowest value added, so a row with no visible key, which the
    callers never attend from usefully, averages its values instead of returning NaN) and with
    :func:`bertforge.ops.dropout.dropout`'s mask, about 4x cheaper to draw than ``bernoulli_``."""
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(q.shape[-1] ** -0.5)
    lowest = torch.finfo(scores.dtype).min
    if mask is not None:
        bias = mask if mask.is_floating_point() else torch.zeros(
            mask.shape, dtype=scores.dtype).masked_fill_(~mask, lowest)
        scores = scores.add_(bias)
    if is_causal:  # SDPA's convention: query i sees keys 0..i
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool).triu_(1)
        scores = scores.masked_fill_(causal, lowest)
    return torch.matmul(dropout(scores.softmax(-1), dropout_p), v)


@functools.lru_cache(maxsize=None)
def _flash_varlen():
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


@functools.lru_cache(maxsize=None)
def _torch_flash_device(device: torch.device) -> bool:
    """Whether PyTorch's own flash kernel runs on ``device``: a CUDA build that has it and a GPU
    of compute capability 8.0 (Ampere) or newer."""
    if device.type != "cuda" or not torch.backends.cuda.is_flash_attention_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def _torch_flash_ok(device: torch.device, half: bool, head_dim: int | None) -> bool:
    shape_ok = head_dim is None or (head_dim % 8 == 0 and head_dim <= 256)
    return half and shape_ok and _torch_flash_device(device)


def resolve_backend(name: str, device: torch.device, dtype: torch.dtype,
                    head_dim: int | None = None) -> str:
    """The backend ``auto`` means on ``device`` for ``dtype`` (and, when given, the head size); a
    named one is checked."""
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r} is not one of {', '.join(BACKENDS)}")
    half = dtype in (torch.float16, torch.bfloat16)
    if name == "flash" and (_flash_varlen() is None or device.type != "cuda" or not half):
        raise ValueError("the flash backend needs the flash-attn package, a CUDA device and "
                         "fp16/bf16 activations; use backend auto")
    if name == "torch-flash" and not _torch_flash_ok(device, half, head_dim):
        raise ValueError("the torch-flash backend needs a CUDA GPU of compute capability 8.0 or "
                         "newer, PyTorch built with flash attention, fp16/bf16 activations and "
                         "a head size that is a multiple of 8 up to 256; use backend auto")
    if name != "auto":
        return name
    if device.type == "cuda":
        if half and _flash_varlen() is not None:
            return "flash"
        return "torch-flash" if _torch_flash_ok(device, half, head_dim) else "nested"
    return "padded"


def fused_varlen(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int,
                 dropout_p: float = 0.0, causal: bool = False) -> torch.Tensor:
    """Queries (T_q, heads, head_dim) of the sequences ``cu_q`` over keys and values (T_k, heads,
    head_dim) of the sequences ``cu_k`` (int32 offsets; ``max_*`` host ints) with a fused varlen
    kernel: ``flash`` (the flash-attn package) or ``torch-flash`` (PyTorch's own operator, which
    wants a contiguous layout; its gradients come from PyTorch's autograd formula for it)."""
    if backend == "flash":
        return _flash_varlen()(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=dropout_p,
                               causal=causal)
    q, k, v = (x.contiguous() for x in (q, k, v))
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p,
                                                   causal, False)[0]


@torch.compiler.disable  # a kernel call on data-dependent layouts: eager between compiled regions
def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TokenLayout,
                     dropout_p: float = 0.0, backend: str = "auto") -> torch.Tensor:
    """Bidirectional attention within each sequence: q, k, v (T, heads, head_dim) -> same shape."""
    backend = resolve_backend(backend, q.device, q.dtype, q.shape[-1])
    if backend in FUSED:
        cu = layout.cu_seqlens
        return fused_varlen(backend, q, k, v, cu, cu, layout.max_seqlen, layout.max_seqlen,
                            dropout_p)
    if backend == "nested":
        return _nested_attention(q, k, v, layout, dropout_p)
    return _bucketed_attention(q, k, v, layout, dropout_p)


def queries_at_rows(where: Attend, backend: str, device: torch.device, dtype: torch.dtype,
                    head_dim: int) -> bool:
    """Whether :func:`attend_at` runs for this layout and kernel: unpadded tokens, with the
    ``padded`` backend or a fused one (the nested and padded-row paths attend every query)."""
    if not isinstance(where, TokenLayout):
        return False
    return resolve_backend(backend, device, dtype, head_dim) in ("padded", *FUSED)


@torch.compiler.disable
def attend_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TokenLayout,
              rows: torch.Tensor, dropout_p: float = 0.0, backend: str = "auto") -> torch.Tensor:
    """Attention for some queries only: q (K, heads, head_dim), the queries of the tokens at
    ``rows`` ((K,) ascending indices into the T tokens, repeats allowed), over the keys and
    values (T, heads, head_dim) of their own sequences -> (K, heads, head_dim), what
    :func:`varlen_attention` gives at those rows. Where :func:`queries_at_rows` says so."""
    if rows.shape[0] == 0:
        return q
    backend = resolve_backend(backend, q.device, q.dtype, q.shape[-1])
    if backend in FUSED:
        cu = layout.cu_seqlens
        # rows ascend, so the queries before sequence n's first token are those of 0..n-1; the
        # longest sequence bounds every query count: nothing is read back from the device
        cu_q = torch.searchsorted(rows, cu.to(rows.dtype)).to(torch.int32)
        return fused_varlen(backend, q, k, v, cu_q, cu, layout.max_seqlen, layout.max_seqlen,
                            dropout_p)
    return _bucketed_attention(q, k, v, layout, dropout_p, rows)


def nested_heads(x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """(T, heads, head_dim) -> a jagged nested tensor (N, heads, j, head_dim) that knows its
    shortest and longest sequence, so SDPA's kernel selection reads no length from the device."""
    if layout.offsets is None:  # int64 offsets, made once per batch and shared by every layer
        layout.offsets = layout.cu_seqlens.long()
    return torch.nested.nested_tensor_from_jagged(
        x, offsets=layout.offsets, min_seqlen=layout.min_seqlen,
        max_seqlen=layout.max_seqlen).transpose(1, 2)


def _nested_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TokenLayout,
                      dropout_p: float) -> torch.Tensor:
    """The ``nested`` backend: SDPA on jagged nested tensors, PyTorch's fused varlen kernels on
    CUDA."""
    if q.device.type != "cpu":
        return _jagged_sdpa(q, k, v, layout, dropout_p)
    with warnings.catch_warnings():
        # PyTorch's CPU math fallback for jagged inputs converts them to its prototype strided
        # nested layout and says so on every call (no fused CPU kernel exists).
        warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in "
                                "prototype stage", category=UserWarning)
        return _jagged_sdpa(q, k, v, layout, dropout_p)


def _jagged_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TokenLayout,
                 dropout_p: float) -> torch.Tensor:
    out = F.scaled_dot_product_attention(nested_heads(q, layout), nested_heads(k, layout),
                                         nested_heads(v, layout), dropout_p=dropout_p)
    return out.transpose(1, 2).values()


@dataclass
class _Bucket:
    members: np.ndarray   # the sequences in the bucket
    width: int            # their padded length
    keep: torch.Tensor | None  # (1, rows, 1, width) key mask; None when every row is full

    @property
    def rows(self) -> int:
        return len(self.members)


@dataclass
class _Plan:
    heads: int
    buckets: list[_Bucket]
    gathering: Gathering | None  # the (T * heads) token-major rows -> the buckets' slots


def _per_head(cu: np.ndarray, heads: int) -> np.ndarray:
    """Offsets of every head's copy of the sequences ``cu`` (head-major), for ``SlotBuilder``."""
    total = int(cu[-1])
    starts = (cu[:-1][None, :] + total * np.arange(heads)[:, None]).reshape(-1)
    return np.append(starts, heads * total)


def _head_members(members: np.ndarray, n: int, heads: int) -> np.ndarray:
    return (members[None, :] + n * np.arange(heads)[:, None]).reshape(-1)


def _plan(layout: TokenLayout, heads: int, device: torch.device) -> _Plan:
    """Sequences grouped by length rounded up to ``BUCKET`` (host arithmetic on the lengths: free
    when the layout came from the loader on the CPU, one sync for a layout on a GPU). Every
    head's copy of a sequence is a sequence of its own, so that each bucket's slots are one
    contiguous (heads, rows, width) block."""
    cu = layout.cu_seqlens.cpu().numpy().astype(np.int64)
    n = len(cu) - 1
    widths = bucket_widths(np.diff(cu))
    slots, buckets = SlotBuilder(_per_head(cu, heads)), []
    for width in np.unique(widths).tolist():  # a loop over a handful of widths
        members = np.flatnonzero(widths == width)
        real = slots.add(_head_members(members, n, heads), width)
        rows = real[:len(members)]                                 # (rows, width), head 0's
        keep = None if rows.all() else torch.from_numpy(rows).to(device)[None, :, None, :]
        buckets.append(_Bucket(members, width, keep))
    return _Plan(heads, buckets, slots.build(device, heads))


def _cached_plan(layout: TokenLayout, heads: int, device: torch.device) -> _Plan:
    if layout.buckets is None or layout.buckets.heads != heads:
        layout.buckets = _plan(layout, heads, device)
    return layout.buckets


def _query_slots(layout: TokenLayout, plan: _Plan, rows: torch.Tensor,
                 device: torch.device) -> tuple[list[int], Gathering | None]:
    """Rows of queries for the queries at ``rows`` (ascending token indices), in ``plan``'s
    buckets: each bucket's query width is its sequences' most queries (0: the bucket is
    skipped), a sequence with fewer is padded."""
    cu = layout.cu_seqlens.cpu().numpy().astype(np.int64)
    n, cu_q = len(cu) - 1, np.searchsorted(rows.cpu().numpy(), cu)
    counts = np.diff(cu_q)
    slots, widths = SlotBuilder(_per_head(cu_q, plan.heads)), []
    for b in plan.buckets:
        width = int(counts[b.members].max())
        if width:
            slots.add(_head_members(b.members, n, plan.heads), width)
        widths.append(width)
    return widths, slots.build(device, plan.heads)


def _bucketed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TokenLayout,
                        dropout_p: float, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The ``padded`` backend: one padded row per *sequence* (so packed rows stay
    block-diagonal), sequences of similar length batched together so that a short sequence is
    not padded to the batch's longest. The rows come from one gather of the tokens
    (``bertforge.ops.slots``: padding slots repeat a real token, whose key is masked) with the
    heads first, (heads, rows, width, head_dim) per bucket: every head and row is then one
    contiguous matrix for the matrix products. With ``rows``, ``q`` holds only the queries at
    those tokens, laid out in rows of their own."""
    count, heads, head_dim = q.shape[0], k.shape[1], k.shape[2]
    plan = _cached_plan(layout, heads, k.device)
    if rows is None:
        widths, queries = [b.width for b in plan.buckets], plan.gathering
    else:
        widths, queries = _query_slots(layout, plan, rows, k.device)
    # (T, heads, head_dim) viewed as (T * heads, head_dim): the gatherings read token-major
    k, v = (gather(x.reshape(-1, head_dim), plan.gathering) for x in (k, v))
    q = gather(q.reshape(-1, head_dim), queries)
    sizes = [heads * b.rows * b.width for b in plan.buckets]
    parts = []
    q_parts = q.split([heads * b.rows * w for b, w in zip(plan.buckets, widths)])
    for b, w, qb, kb, vb in zip(plan.buckets, widths, q_parts, k.split(sizes), v.split(sizes)):
        if w:
            context = sdpa(qb.view(heads, b.rows, w, head_dim),
                           kb.view(heads, b.rows, b.width, head_dim),
                           vb.view(heads, b.rows, b.width, head_dim), b.keep, dropout_p)
            parts.append(context.reshape(-1, head_dim))
    flat = parts[0] if len(parts) == 1 else torch.cat(parts)
    return scatter(flat, queries).view(count, heads, head_dim)


__all__ = ["Attend", "BACKENDS", "BUCKET", "FUSED", "attend", "attend_at", "fused_varlen",
           "nested_heads", "queries_at_rows", "resolve_backend", "sdpa", "varlen_attention"]
