"""Retrieval: exact search in bounded memory, retrieval and STS evaluation, reranking, and
hard-negative mining for embedding models.

Everything here takes embedding (or pair-scoring) callables, not models: ``bertforge evaluate
retrieval|sts`` and ``bertforge mine`` pass those of a model directory
(``bertforge.inference.embedding``), and the sentence-similarity training task passes its
in-memory model's. Modules import torch only where they search; this package imports nothing
heavy itself.
"""
