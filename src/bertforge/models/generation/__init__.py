"""Generation for encoder-decoder models: the settings (``config``), greedy and beam search
(``search``, ``beam``) with their per-step constraints (``constraints``), and the decoder steps
they run (``decoders``; bertforge's BART's own in ``bart_decoding``); the settings a model
generates with and batched decoding of encoded texts (``texts``)."""

from bertforge.models.generation.config import GENERATION_CONFIG_NAME, GenerationConfig
from bertforge.models.generation.search import EncoderDecoderModel, generate

__all__ = ["GENERATION_CONFIG_NAME", "EncoderDecoderModel", "GenerationConfig", "generate"]
