"""Kernels shared by the models and the data loader, below both: token layouts (unpadding,
packing) in ``ops.unpad``, the one attention entry point in ``ops.attention`` (with
``ops.slots``: unpadded tokens to padded rows and back), the CPU dropout in ``ops.dropout`` and
the vocabulary loss in ``ops.loss``.

Nothing here imports models, data, train or tasks; only ``bertforge.core`` and ``errors``.
"""
