"""Generation for encoder-decoder models: the settings (``config``) and greedy and beam search on
a KV cache (``search``)."""

from bertforge.models.generation.config import GENERATION_CONFIG_NAME, GenerationConfig
from bertforge.models.generation.search import EncoderDecoderModel, generate

__all__ = ["GENERATION_CONFIG_NAME", "EncoderDecoderModel", "GenerationConfig", "generate"]
