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

Bidirectional sliding windows (ModernBERT's local layers): a query at i sees the keys j of its
own sequence with ``|i - j| <= window`` (transformers' ``sliding_window_bidirectional_overlay``,
flash-attn's ``window_size=(window, window)``). Padded rows carry the band in their keep mask
(:func:`band_keep_mask`, made once per batch), so they are plain SDPA; unpadded tokens come as
a :class:`WindowPlan` (:func:`window_varlen_attention`): flash-attn's windowed varlen kernel
(CUDA, fp16/bf16; NOT TESTED: no GPU in development), the global varlen kernel when no sequence
is longer than ``window + 1``, otherwise blocked local attention
(:func:`blocked_window_attention`: blocks of queries against the keys ``window`` either side of
their block, one batched SDPA call, work linear in T, any device).

The result has the shape of ``q``; ``out.flatten(-2)`` merges the heads again.
:func:`attend_at` attends the queries of some tokens only (an encoder's last layer, where the
heads read a few states), over their whole sequences' keys.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.core.limits import ATTENTION_BACKENDS as BACKENDS
from bertforge.core.limits import FUSED_ATTENTION_BACKENDS as FUSED  # one fused_varlen call
from bertforge.ops.dropout import dropout
from bertforge.ops.slots import BUCKET, Gathering, SlotBuilder, bucket_widths, gather, scatter
from bertforge.ops.unpad import TokenLayout

@dataclass
class WindowPlan:
    """What sliding-window layers of an unpadded pass attend with: the batch's ``TokenLayout``
    and the window, plus the blocked kernel's additive mask, made on first use and shared by
    every local layer of the pass (building it costs about one layer's attention)."""

    layout: TokenLayout
    window: int
    bias: torch.Tensor | None = field(default=None, repr=False, compare=False)
    """(blocks, 1, block, span) 0 / -inf mask of :func:`blocked_window_attention`."""

    def blocked_bias(self, dtype: torch.dtype) -> torch.Tensor:
        if self.bias is None or self.bias.dtype != dtype:
            self.bias = window_bias(self.layout.sequence_of_token(), self.window,
                                    default_block(self.window), dtype)
        return self.bias


Attend = torch.Tensor | TokenLayout | WindowPlan | None
"""What attention reads besides q, k, v: a padded keep mask (or None: every key visible) for
(B, S, heads, head_dim) inputs, or the ``TokenLayout`` (``WindowPlan`` for sliding windows) of
(T, heads, head_dim) inputs."""


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, where: Attend,
           dropout_p: float = 0.0, backend: str = "auto") -> torch.Tensor:
    """Bidirectional attention, within each sequence: q, k, v (B, S, heads, head_dim) with a
    keep mask (True = may attend; a window's band included) or None, or (T, heads, head_dim)
    with their ``TokenLayout`` or ``WindowPlan`` -> the shape of q. ``backend``
    (``BACKENDS``) picks the kernel for unpadded tokens."""
    if isinstance(where, TokenLayout):
        return varlen_attention(q, k, v, where, dropout_p, backend)
    if isinstance(where, WindowPlan):
        return window_varlen_attention(q, k, v, where, dropout_p, backend)
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


# ---------------------------------------------------------------------- sliding windows
def band_keep_mask(keep: torch.Tensor | None, seq_len: int, window: int,
                   always: bool = False) -> torch.Tensor | None:
    """The padded path's sliding-window mask: ``keep`` ((B, 1, 1 or S, S) bool or None) and the
    band ``|i - j| <= window`` over the S columns -> (B or 1, 1, S, S) bool; ``keep`` itself
    when the band covers every pair. Every query keeps itself, so a padding query far from any
    real token still has a key (finite, unused output). ``always``: build the band even when it
    covers every pair (a traced graph must not freeze that length test)."""
    if seq_len - 1 <= window and not always:
        return keep
    cols = torch.arange(seq_len, device=keep.device if keep is not None else None)
    offsets = cols[:, None] - cols[None, :]                         # (S, S)
    band = offsets.abs() <= window
    if keep is None:
        return band[None, None]
    return (keep & band) | (offsets == 0)  # (not torch.eye: ONNX's EyeLike has no bool kernel)


@torch.compiler.disable  # data-dependent layouts: eager between compiled regions
def window_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            plan: WindowPlan, dropout_p: float = 0.0,
                            backend: str = "auto") -> torch.Tensor:
    """Sliding-window attention within each sequence: (T, heads, head_dim) -> same shape."""
    layout, window = plan.layout, plan.window
    if layout.max_seqlen - 1 <= window:  # the window hides nothing
        return varlen_attention(q, k, v, layout, dropout_p, backend)
    if resolve_backend(backend, q.device, q.dtype, q.shape[-1]) == "flash":  # UNTESTED (no GPU)
        cu = layout.cu_seqlens
        return _flash_varlen()(q, k, v, cu, cu, layout.max_seqlen, layout.max_seqlen,
                               dropout_p=dropout_p, window_size=(window, window))
    return blocked_window_attention(q, k, v, layout.sequence_of_token(), window, dropout_p,
                                    bias=plan.blocked_bias(q.dtype))


def default_block(window: int) -> int:
    """Queries per block: twice the window (at least 32), so a query is scored against
    ``4 * window`` keys where ``2 * window + 1`` matter, and blocks stay few."""
    return max(32, 2 * window)


def window_bias(sequence: torch.Tensor, window: int, block: int,
                dtype: torch.dtype) -> torch.Tensor:
    """The additive mask of :func:`blocked_window_attention`: (blocks, 1, block, span), 0 where
    query ``b * block + i`` may see key ``b * block - window + j`` (same sequence, ``|distance|
    <= window``), -inf elsewhere. Padding tokens are sequence -1: they see each other only
    (finite, discarded outputs), and every real query sees itself, so no row is all -inf."""
    t = sequence.shape[0]
    blocks = -(-t // block)
    tail, span = blocks * block - t, block + 2 * window
    seq_q = F.pad(sequence, (0, tail), value=-1).view(blocks, block)
    seq_k = F.pad(sequence, (window, tail + window), value=-1).unfold(0, span, block)
    device = sequence.device
    offsets = torch.arange(block, device=device)[:, None] - torch.arange(span, device=device)
    band = (offsets + window).abs() <= window                       # (block, span)
    keep = (seq_q[:, :, None] == seq_k[:, None, :]) & band          # (blocks, block, span)
    bias = torch.zeros(keep.shape, dtype=dtype, device=device)
    return bias.masked_fill_(~keep, float("-inf"))[:, None]


def blocked_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             sequence: torch.Tensor, window: int, dropout_p: float = 0.0,
                             block: int | None = None,
                             bias: torch.Tensor | None = None) -> torch.Tensor:
    """q, k, v (T, heads, head_dim) of consecutive tokens, ``sequence`` (T,) the sequence
    number of each (non-decreasing: a sequence's tokens are contiguous) -> (T, heads,
    head_dim): token t attends to the tokens u of its sequence with ``|t - u| <= window``.
    ``bias``: :func:`window_bias` of these arguments, when the caller has it already."""
    t = q.shape[0]
    block = block or default_block(window)
    blocks = -(-t // block)
    tail, span = blocks * block - t, block + 2 * window
    if bias is None:
        bias = window_bias(sequence, window, block, q.dtype)
    # queries: (T, h, d) -> (blocks, h, block, d)
    qb = F.pad(q, (0, 0, 0, 0, 0, tail)).view(blocks, block, *q.shape[1:]).transpose(1, 2)

    def keys(x: torch.Tensor) -> torch.Tensor:  # (T, h, d) -> (blocks, h, span, d), a view
        padded = F.pad(x, (0, 0, 0, 0, window, tail + window))
        return padded.unfold(0, span, block).permute(0, 1, 3, 2)

    out = sdpa(qb, keys(k), keys(v), bias, dropout_p)
    return out.transpose(1, 2).reshape(blocks * block, *q.shape[1:])[:t]


__all__ = ["Attend", "BACKENDS", "BUCKET", "FUSED", "WindowPlan", "attend", "attend_at",
           "band_keep_mask", "blocked_window_attention", "default_block", "fused_varlen",
           "nested_heads", "queries_at_rows", "resolve_backend", "sdpa", "varlen_attention",
           "window_bias", "window_varlen_attention"]
