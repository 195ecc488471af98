"""Synthetic retrieval data for the embedding and reranker tests: made-up topic nouns in
sentences of filler words, so a text is relevant to a query exactly when it names the query's
topic, and a tiny random BERT whose WordPiece vocabulary holds every word."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from bertforge.models import BertConfig, BertModel
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

TOPICS = [f"{a}{b}" for a in ("ka", "lo", "mi", "ne", "pu", "ro", "su", "ti")
          for b in ("ba", "de", "fo", "gu", "hi", "ja")]  # 48 made-up nouns
FILLER = "the a of is near by with under over old new small big red blue green".split()
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!:'-")


def sentence(rng: random.Random, topic: str, n: int) -> str:
    """``n`` filler words with ``topic`` at a random place."""
    words = [rng.choice(FILLER) for _ in range(n)]
    words.insert(rng.randrange(n + 1), topic)
    return " ".join(words)


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def save_tiny_encoder(directory: Path, positions: int = 256) -> Path:
    """A random 2-layer, 32-wide BERT without dropout (runs compare exactly) and its tokenizer."""
    words = [*TOPICS, *FILLER, "query", "passage", "where", "what"]
    tok = BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *CHARS,
                                            *[f"##{c}" for c in CHARS], *words])))
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=positions, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return BertModel(config).save_pretrained(directory, tokenizer=tok)
