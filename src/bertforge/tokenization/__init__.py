"""Tokenizers: BERT's WordPiece (``wordpiece``), BART's byte-level BPE (``bpe``), ModernBERT's
byte-level BPE with BERT's special tokens (``modern``), what they share (``base``),
``load_tokenizer`` for whatever a path holds (``loading``), and training new vocabularies from a
corpus (``training``, ``bertforge vocab``). All of them run on the `tokenizers` library."""

from bertforge.tokenization.base import BackendTokenizer, EncoderTokenizer, Window
from bertforge.tokenization.bpe import BPE_SPECIAL_TOKENS, BpeTokenizer
from bertforge.tokenization.loading import load_tokenizer, read_vocab_tokens
from bertforge.tokenization.modern import MODERN_SPECIAL_TOKENS, ModernBpeTokenizer
from bertforge.tokenization.wordpiece import (SPECIAL_TOKENS, BertTokenizer, check_casing,
                                              read_vocab_txt, vocab_casing, vocab_hash)

__all__ = ["BPE_SPECIAL_TOKENS", "BackendTokenizer", "BertTokenizer", "BpeTokenizer",
           "EncoderTokenizer", "MODERN_SPECIAL_TOKENS", "ModernBpeTokenizer", "SPECIAL_TOKENS",
           "Window", "check_casing", "load_tokenizer", "read_vocab_tokens",
           "read_vocab_txt", "vocab_casing", "vocab_hash"]
