"""The settings of the embedding tasks (sentence-similarity, text-ranking): the ``embedding.*``
section of the fine-tuning config (``--embedding.pooling=cls``), docs/embeddings.md.

Torch-free on purpose: ``bertforge.config`` composes ``FinetuneConfig`` from the task settings
records (``bertforge.tasks.settings``) when it is imported, and ``--help`` imports no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

from bertforge.core.limits import POOLINGS
from bertforge.core.schema import opt
from bertforge.errors import ConfigError

EMBEDDING_LOSSES = ("auto", "infonce", "cosent", "margin-mse", "bce", "listwise")


@dataclass
class EmbeddingConfig:
    """sentence-similarity (embedding models) and text-ranking (rerankers): docs/embeddings.md."""

    loss: str = opt("auto", "auto (from the data's columns: infonce for anchor/positive[/"
                    "negatives], cosent for scored pairs, margin-mse with teacher scores; "
                    "text-ranking: bce for labelled pairs, listwise for query/positive/"
                    "negatives), or one of infonce cosent margin-mse bce listwise.",
                    run_defining=True, choices=EMBEDDING_LOSSES)
    scale: float = opt(20.0, "Inverse temperature of the infonce and cosent similarities (20 = "
                       "temperature 0.05).", run_defining=True)
    symmetric: bool = opt(False, "infonce: also score each positive against all anchors.",
                          run_defining=True)
    cache_chunk: int = opt(0, "Cached pass (GradCache): texts per forward pass, replayed in "
                           "backward; memory no longer grows with the batch (and its in-batch "
                           "negatives), the gradients are the same. 0 = off.", run_defining=True,
                           minimum=0)
    matryoshka_dims: Optional[List[int]] = opt(None, "Train every prefix of these sizes too "
                                               "(e.g. 384 256 128 64); the served `dimensions`.",
                                               run_defining=True)
    pooling: str = opt("mean", "Text vector: mean of the tokens, cls (first token) or last (last "
                       "real token).", run_defining=True, choices=POOLINGS)
    normalize: bool = opt(True, "Unit-length vectors (cosine similarity); saved with the model.",
                          run_defining=True)
    query_prompt: Optional[str] = opt(None, "Text put before every anchor/query (e.g. "
                                      "'query: '); saved as the model's 'query' prompt.",
                                      run_defining=True)
    passage_prompt: Optional[str] = opt(None, "Text put before every positive/negative (e.g. "
                                        "'passage: '); saved as the 'document' prompt.",
                                        run_defining=True)
    no_duplicates: bool = opt(True, "No global batch holds the same text twice (a duplicate "
                              "would be its own in-batch negative).", run_defining=True)
    gather: bool = opt(True, "Across ranks, score every anchor against all ranks' candidates "
                       "(gradients flow back to their owners).", run_defining=True)

    def check(self) -> None:
        """ConfigError for a value no embedding or reranker run can use (called by those tasks
        only, ``tasks.settings.check_task_settings``: every fine-tuning config builds this
        section, and a SQuAD run has nothing to check here)."""
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ConfigError(f"embedding.scale must be a positive number, got {self.scale}")
        dims = self.matryoshka_dims
        if dims is not None and (not dims or any(d < 1 for d in dims)
                                 or len(set(dims)) != len(dims)):
            raise ConfigError("embedding.matryoshka_dims must list distinct sizes >= 1, got "
                              f"{list(dims)}")


__all__ = ["EMBEDDING_LOSSES", "EmbeddingConfig"]
