"""Inference pipelines: one loaded model, its tokenizer and its task, answering request items.

``bertforge predict MODE``, the HTTP server and the ONNX backend all go through a ``Pipeline``:
``parse`` validates one request item (a JSON object) and encodes it, so a bad field is an
``InputError`` naming it before any batch is formed; ``cost`` is the tokens the item will occupy
(the server's token budget); ``run`` takes parsed requests as one padded batch and returns one
JSON-able result per request, the same as if each had run alone. Calling a pipeline takes
parsed requests (the server and ``predict``) or raw input as transformers' pipelines do: a
string, a dict of fields or a list of them (``pipeline()`` builds one by task name;
docs/python.md).

Pre- and post-processing are the fine-tuning tasks' own: SQuAD windows and the n-best search
(``qa_features``, ``postprocess_qa``, with the run's config.yaml settings when present), the
label names saved in config.json, first-sub-token tagging, and generation settings from
generation_config.json. So a pipeline answers what evaluation would have answered (QA then
widens an answer to whole words, ``align_to_words``).

A batch is padded to its longest sequence rounded up to a multiple of 8, never to
``max_length``: padding is compute, and requests vary a lot in length. An input longer than
``max_length`` tokens is an ``InputError`` (``truncation="error"``) or is cut and its result says
``"truncated": true`` (``"truncate"``), or, for embeddings and classification, is split into
overlapping windows whose results are pooled (``"chunk"``, ``pipelines.chunking``); QA splits
long contexts into windows itself, and summarization cuts the article to the model's positions
by default. The precision a pipeline runs in is chosen by ``pipelines.numerics`` (``auto``: the
CPU's units and a quality guard).
"""


from bertforge.inference.pipelines.base import InputError, Pipeline, TextRequest
from bertforge.inference.pipelines.loading import infer_task, load_pipeline, pipeline

__all__ = ["InputError", "Pipeline", "TextRequest", "infer_task", "load_pipeline", "pipeline"]
