"""The precision a pipeline runs in (``precision=auto|fp32|bf16|int8|fp16``): chosen from the
CPU's units and held to the quality guard of ``bertforge.runtime.guard``, with a fixed probe of
texts tokenized as the pipeline tokenizes requests."""

from __future__ import annotations

import copy
from typing import Any

from bertforge.models.registry import family_of_config
from bertforge.runtime.cpu import CpuUnits
from bertforge.runtime.guard import PrecisionChoice, Probe, choose_precision

PROBE: tuple[tuple[str, str | None], ...] = (
    ("The quick brown fox jumps over the lazy dog.", None),
    ("A central bank raised interest rates by half a point on Tuesday.", None),
    ("Where was the treaty signed?", "The treaty was signed in Paris in 1783, ending the war."),
    ("I loved this film: the acting was superb and the story moving.", None),
    ("The service was slow and the food arrived cold.", None),
    ("Who wrote the novel?", "The novel was written by a Russian author in the 1860s and "
                             "published in serial form."),
    ("Photosynthesis converts light energy into chemical energy stored in glucose.", None),
    ("How many moons does Mars have?", "Mars has two small moons, Phobos and Deimos."),
    ("Stocks fell sharply after the report.", "Markets dropped when the figures came out."),
    ("The committee will meet again next week to discuss the budget for the coming year, "
     "including the spending on schools, roads and hospitals.", None),
    ("A man is playing a guitar.", "Someone plays an instrument."),
    ("Water boils at 100 degrees Celsius at sea level.", None),
)
"""The probe: single texts and pairs of the kinds the tasks take (sentences, reviews,
question-paragraph pairs, sentence pairs), short so that the probe costs milliseconds."""


def pipeline_probe(pipe: Any) -> Probe:
    """:data:`PROBE` as the pipeline's model inputs (cut to its length) with their mask."""
    cutting = copy.copy(pipe)  # the probe is cut to the pipeline's length, whatever it does
    cutting.truncation = "truncate"
    inputs = pipe.pad([cutting.encode_text(text, pair)[0] for text, pair in PROBE])
    return Probe(inputs, inputs["attention_mask"])  # every family's inputs have a mask


def settle_precision(pipe: Any, asked: str, units: CpuUnits | None = None) -> PrecisionChoice:
    """Choose ``pipe``'s precision for ``asked``, apply it to its model (loaded in fp32) and
    set ``pipe.precision``; returns the choice (``runtime.guard.choose_precision``)."""
    choice, pipe.precision = choose_precision(
        pipe.model, pipe.device, asked, pipeline_probe(pipe),
        seq2seq=family_of_config(pipe.config).seq2seq, units=units, where=str(pipe.model_dir))
    return choice


__all__ = ["PROBE", "pipeline_probe", "settle_precision"]
