"""``bertforge generate``: batch generation (summaries) with a BART model, with the generation
options every command shares (``bertforge.config.GenerationOptions``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from bertforge.commands.base import Command, beside, precision_option
from bertforge.config import GenerationOptions
from bertforge.core.limits import MIN_SEQUENCE_TOKENS
from bertforge.core.schema import REQUIRED, check_fields, opt, save_config


@dataclass
class GenerateConfig(GenerationOptions):
    """``bertforge generate``: the model's generation_config.json unless overridden here."""

    model: str = opt(REQUIRED, "A BART model directory (e.g. from `bertforge finetune` with "
                     "task: summarization).")
    input: str = opt(REQUIRED, "JSONL/CSV/TSV with a text column (article, document, text, "
                     "...), a CNN/DailyMail story directory, or a .txt with one text per line.")
    output: str = opt(REQUIRED, "JSON Lines to write: {id, summary} per text.")
    text_field: Optional[str] = opt(None, "The input's text column (default: detected).")
    batch_size: int = opt(8, "Texts per batch.", minimum=1)
    device: str = opt("auto", "auto (cuda if available), cpu, cuda, cuda:1...")
    max_source_length: Optional[int] = opt(None, "Input tokens kept per text (default: the "
                                           "model's positions).", minimum=MIN_SEQUENCE_TOKENS)
    precision: str = precision_option()

    def __post_init__(self) -> None:
        check_fields(self)
        super().__post_init__()


def run_generate(cfg: GenerateConfig) -> int:
    from bertforge.core.io import output_lock
    from bertforge.inference.generate import generate_file

    # One writer at a time for the output file and its config.yaml, as for a run's directory.
    with output_lock(Path(cfg.output), "--output", "bertforge generate", beside=True):
        out = generate_file(Path(cfg.model), Path(cfg.input), Path(cfg.output),
                            overrides=cfg.generation_overrides(), batch_size=cfg.batch_size,
                            device=cfg.device, text_field=cfg.text_field,
                            max_source_length=cfg.max_source_length, precision=cfg.precision)
        save_config(cfg, beside(out))
    print(f"wrote {out}")
    return 0


GENERATE = Command("generate", "Generate with a BART model (batch summarization), using its "
                   "generation_config.json unless overridden.", GenerateConfig, run_generate,
                   saves="beside the output: OUTPUT.config.yaml")
