"""Kernels shared by the models and the data loader, below both: token layouts (unpadding,
packing) in ``ops.unpad`` and the one attention entry point in ``ops.attention``.

Nothing here imports models, data, train or tasks; only ``bertforge.core`` and ``errors``.
"""
