"""The pipeline base class, request-field checks and the shared constants."""

from __future__ import annotations

import copy
import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, is_dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from bertforge.core.kinds import json_kind
from bertforge.data.finetuning.labels import LabelMap
from bertforge.data.collate.seq2seq import pad_rows
from bertforge.models.registry import family_of_config
from bertforge.runtime.precision import Precision
from bertforge.tokenization import EncoderTokenizer, Window
from bertforge.tokenization.prefix import Capped, encode_ids_capped, encode_window_capped


TRUNCATION = ("error", "truncate", "chunk")
"""What a pipeline does with an input over ``max_length``: refuse it, cut it, or split it into
overlapping windows whose results are pooled (``chunking``; only where ``Pipeline.chunks``)."""
_MASKED_LOGIT = -1e4  # start/end logits of padding, never part of a span
_MAX_TOP_K = 100


CUT_IN_PYTHON = "pass truncate=True"
"""How a caller of a pipeline asks for a long input to be cut (``InputError``'s ``{cut}``)."""


class InputError(ValueError):
    """A bad field of one request item: ``field`` names it ("question", "inputs[2].context"; ""
    for the item itself) and ``message`` says what is wrong and what to send instead.

    A message that names other fields of the item writes them ``{name}`` (listed in
    ``refers``) and one that says how to ask for a cut writes ``{cut}`` (``cuts``): the server
    and the command line speak of other names (``query`` and ``texts[1]`` for a pair,
    ``"truncate": true``), and ``renamed`` puts theirs in."""

    def __init__(self, field: str, message: str, refers: tuple[str, ...] = (),
                 cuts: bool = False) -> None:
        self.template, self.refers, self.cuts = message, refers, cuts
        self.field = field
        self.message = _fill(message, {n: n for n in refers}, CUT_IN_PYTHON if cuts else None)
        super().__init__(f"{field}: {self.message}" if field else self.message)

    def __reduce__(self) -> tuple:  # whole across processes (a server's replicas)
        return (InputError, (self.field, self.template, self.refers, self.cuts))

    def within(self, prefix: str) -> InputError:
        """The same error with its field inside ``prefix`` (``inputs[2]`` + ``context``)."""
        return InputError(f"{prefix}.{self.field}" if self.field else prefix, self.template,
                          self.refers, self.cuts)

    def renamed(self, names: Mapping[str, str], cut: str) -> InputError:
        """The error in a caller's own words: every field it names, its own and those of its
        message, by ``names`` (a field not there keeps its name), and ``cut`` saying how that
        caller asks for a long input to be cut."""
        message = _fill(self.template, {n: names.get(n, n) for n in self.refers},
                        cut if self.cuts else None)
        return InputError(names.get(self.field, self.field), message)


def _fill(template: str, names: Mapping[str, str], cut: str | None) -> str:
    # Plain replacement, not str.format: a message may quote the client's own braces.
    for name, shown in names.items():
        template = template.replace("{" + name + "}", shown)
    return template if cut is None else template.replace("{cut}", cut)


def too_long(n: int, limit: int, pair: bool, counted: bool = True) -> InputError:
    """The error of an input of ``n`` tokens over ``limit``; a pair is named by its second
    text (what a reranker's client sends one of per item), with the first in the message.
    ``counted=False``: only a prefix of the input was tokenized (``n`` is its tokens, a lower
    bound: :mod:`bertforge.tokenization.prefix`)."""
    n = f"{n}" if counted else f"at least {n}"
    if pair:
        return InputError("text_pair", f"together with {{text}}, {n} tokens long, over this "
                          f"model's limit of {limit} tokens; shorten them, or {{cut}} to cut "
                          "them", refers=("text",), cuts=True)
    return InputError("text", f"{n} tokens long, over this model's limit of {limit} tokens; "
                      "shorten it, or {cut} to cut it", cuts=True)


# --- request fields ------------------------------------------------------------------------------


def _fields(item: Any, allowed: Sequence[str]) -> Mapping[str, Any]:
    """``item`` as a mapping whose keys are all in ``allowed``."""
    if not isinstance(item, Mapping):
        raise InputError("", f"expected a JSON object with {', '.join(allowed)}, got "
                         f"{json_kind(item)}")
    for key in item:
        if key not in allowed:
            raise InputError(str(key), f"is not a field of this request; fields: "
                             f"{', '.join(allowed)}")
    return item


def _text(item: Mapping[str, Any], name: str, required: bool = True) -> str | None:
    value = item.get(name)
    if value is None:
        if required:
            raise InputError(name, "is required: a non-empty string")
        return None
    if not isinstance(value, str):
        raise InputError(name, f"must be a string, got {json_kind(value)}")
    if not value.strip():
        raise InputError(name, "must not be empty")
    check_unicode(value, name)
    return value


def check_unicode(value: str, name: str) -> None:
    """``InputError`` for a string that cannot be UTF-8: a lone surrogate, which is how Python
    carries bytes that were not UTF-8 (stdin's surrogateescape) or a ``"\\ud800"`` JSON escape
    without its pair. Tokenizers refuse such strings with an unhelpful TypeError."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(value[exc.start])
        what = (f"byte 0x{code - 0xDC00:02x}, which is not UTF-8" if 0xDC80 <= code <= 0xDCFF
                else f"an unpaired surrogate \\u{code:04x}")
        raise InputError(name, f"is not valid UTF-8 text: character {exc.start + 1} is {what}; "
                         "send UTF-8 text") from None


def _flag(item: Mapping[str, Any], name: str) -> bool | None:
    """An optional true/false field (a Python caller's numpy bool too, as Python's)."""
    value = item.get(name)
    if value is not None and not isinstance(value, (bool, np.bool_)):
        raise InputError(name, f"must be true or false, got {json_kind(value)} {_shown(value)}")
    return None if value is None else bool(value)


def _number(item: Mapping[str, Any], name: str, kind: type, minimum: float | None = None,
            maximum: float | None = None) -> Any:
    """An optional int (``kind=int``) or finite float field within [minimum, maximum], as
    Python's (a Python caller's numpy numbers are taken as the numbers they are)."""
    value = item.get(name)
    if value is None:
        return None
    real = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    whole = isinstance(value, numbers.Integral)
    if not real or (kind is int and not whole) or not math.isfinite(value):
        wanted = "a whole number" if kind is int else "a finite number"
        raise InputError(name, f"must be {wanted}, got {json_kind(value)} {value!r}")
    if minimum is not None and value < minimum:
        raise InputError(name, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise InputError(name, f"must be <= {maximum}, got {value}")
    return kind(value)


# --- the base class ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextRequest:
    """A parsed single-text (or text-pair) request: its encoded window and whether it was cut."""

    text: str
    window: Window
    truncated: bool
    top_k: int = 0  # fill-mask only
    windows: tuple[Window, ...] = ()
    """All windows of a text split by ``truncation="chunk"`` (``window`` is the first); empty
    for a text that fits (or was cut), whose one window is ``window``."""


def windows_of(request: Any) -> tuple[Window, ...]:
    """The windows ``request`` runs: all of a chunked text's (``truncation="chunk"``), else its
    one window."""
    return getattr(request, "windows", ()) or (request.window,)


def _shown(value: Any, limit: int = 40) -> str:
    """``repr(value)``, shortened for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _parsed(inputs: Any) -> bool:
    """Whether ``inputs`` is a non-empty list of parsed requests (each a dataclass instance,
    never a raw string or dict)."""
    return (isinstance(inputs, Sequence) and not isinstance(inputs, str) and len(inputs) > 0
            and all(is_dataclass(r) and not isinstance(r, type) for r in inputs))


def _logits(value: Any) -> np.ndarray:
    """Model output (a tensor of the PyTorch model, or an array of another backend) as float32."""
    if torch.is_tensor(value):
        return value.float().cpu().numpy()
    return np.asarray(value, dtype=np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@dataclass
class Pipeline(ABC):
    """One loaded model + tokenizer + task (build with ``load_pipeline``).

    Thread-compatible, not thread-safe: one thread calls it at a time (the server's worker).
    Subclasses add their task's options as fields with defaults (``options`` lists them).
    """

    fields: ClassVar[tuple[str, ...]] = ("text",)
    """The fields of a request item (the request schema; ``parse`` checks each)."""
    text_field: ClassVar[str | None] = "text"
    """The field a bare string input fills (None: the task needs a dict, as QA does)."""
    options: ClassVar[tuple[str, ...]] = ()
    default_truncation: ClassVar[str] = "error"
    windowed: ClassVar[bool] = False
    """Inputs are cut into windows of the task's training length (question answering), not
    encoded whole up to the model's positions."""
    chunks: ClassVar[bool] = False
    """``truncation="chunk"`` applies: a long input's windows are run and their results pooled
    (``chunking``)."""
    decodes: ClassVar[bool] = False
    """Answering runs a decoding loop (summaries): a batch shares the fixed cost of every step,
    so batching pays even where padding costs (a server's batcher bounds padding otherwise)."""

    task: str                  # the canonical task name (bertforge.tasks.registry)
    model: Any                 # the PyTorch model, or a backend with the same call and outputs
    tokenizer: Any             # an EncoderTokenizer (BERT, ModernBERT) or BART's BpeTokenizer
    model_dir: Path
    config: Any                # BertConfig or BartConfig
    device: torch.device
    precision: Precision
    max_length: int            # tokens per sequence (pair), special tokens included
    truncation: str            # one of TRUNCATION
    backend: str = "pytorch"
    precision_choice: Any = None
    """Why the model runs in ``precision`` (``pipelines.numerics.PrecisionChoice``; None for
    an ONNX backend, which runs its export as it is)."""

    @classmethod
    def run_settings(cls, run: Any) -> dict[str, Any]:
        """Options taken from the fine-tuning run that wrote the model (its config.yaml, a
        ``FinetuneConfig``); ``max_length`` among them sets the default input length."""
        return {}

    @abstractmethod
    def parse(self, item: Mapping[str, Any]) -> Any:
        """Validate and encode one request item; ``InputError`` names a missing, wrong-typed,
        empty or too long field."""

    def cost(self, request: Any) -> int:
        """Tokens ``request`` occupies in a batch (all its windows when it was chunked)."""
        return sum(len(w.ids) for w in windows_of(request))

    @abstractmethod
    def run(self, requests: Sequence[Any]) -> list[dict]:
        """One JSON-able result per parsed request, in order, from one padded batch."""

    def __call__(self, inputs: Any = None, /, **fields: Any) -> Any:
        """Answer raw items, or requests ``parse`` made (the server and ``predict`` batch those).

        Raw: a string (the ``text_field``), a dict of request fields, or a list of them;
        ``fields`` are added to every item (``qa(question=..., context=...)``,
        ``fill(text, top_k=3)``). One input gives one result dict, a list gives a list. A bad
        item raises ``InputError`` naming its field and, in a list, its index
        (``inputs[2].context``), and so does a field given twice (``emb("a", text="b")``: a
        string fills the ``text_field``) or a keyword that is no field. ``inputs=`` (as
        transformers' pipelines name it) is the positional input. Parsed requests: the list of
        results of one batch.
        """
        inputs = self._keywords(inputs, fields)
        if not fields and _parsed(inputs):
            return self.run(inputs)
        if inputs is None or isinstance(inputs, (str, Mapping)):
            return self.run([self._parse_raw(inputs, fields)])[0]
        if not isinstance(inputs, Iterable) or isinstance(inputs, (bytes, bytearray)):
            raise InputError("", f"expected a string, a dict of fields or a list of them, got "
                             f"{type(inputs).__name__}")
        return self.run([self._parse_raw(item, fields, i) for i, item in enumerate(inputs)])

    def _keywords(self, inputs: Any, fields: dict[str, Any]) -> Any:
        """The positional input, once ``inputs=`` (its keyword) is taken out of ``fields``;
        ``InputError`` for both at once or for a keyword that is no field of an item, before
        any item is read (so the error names the keyword, not every item's copy of it)."""
        if "inputs" in fields:
            given = fields.pop("inputs")
            if inputs is not None:
                raise InputError("inputs", f"given twice: as the positional input "
                                 f"{_shown(inputs)} and as inputs={_shown(given)}; pass one")
            inputs = given
        for name in fields:
            if name not in self.fields:
                where = (f"; {name} is an option of the pipeline: pass it to pipeline()"
                         if name in self.options else "")
                raise InputError(name, f"is not a field of this request; fields: "
                                 f"{', '.join(self.fields)}{where}")
        return inputs

    def _parse_raw(self, item: Any, fields: Mapping[str, Any], index: int | None = None) -> Any:
        """``parse`` of a raw item (a string fills ``text_field``) with ``fields`` added; an
        error names the item's index in a list, and a field both in the item and in
        ``fields`` is one (two values for one field: which was meant is not ours to guess)."""
        try:
            if isinstance(item, str) and self.text_field is not None:
                if self.text_field in fields:
                    raise InputError(self.text_field, f"given twice: the input {_shown(item)} "
                                     f"fills {self.text_field}, and {self.text_field}="
                                     f"{_shown(fields[self.text_field])} too; pass one")
                item = {self.text_field: item}
            elif item is None:
                item = {}
            elif not isinstance(item, Mapping):
                wanted = "a dict" if self.text_field is None else "a string or a dict"
                raise InputError("", f"expected {wanted} with fields {', '.join(self.fields)}, "
                                 f"got {type(item).__name__}")
            twice = next((key for key in item if key in fields), None)
            if twice is not None:
                raise InputError(str(twice), f"given twice: {_shown(item[twice])} in the input "
                                 f"and {twice}={_shown(fields[twice])}; pass one")
            return self.parse({**item, **fields})
        except InputError as exc:
            raise (exc if index is None else exc.within(f"inputs[{index}]")) from None

    def parsing_copy(self) -> Pipeline:
        """A copy of this pipeline that can ``parse`` on another thread while this one runs
        batches (a server tokenizes off its model's thread): its own tokenizer (encoding sets
        the tokenizer's truncation, and an item's ``truncate`` the pipeline's) and its own
        settings; it shares the model, which parsing only reads. Parses exactly as this one."""
        clone = copy.copy(self)
        clone.tokenizer = copy.deepcopy(self.tokenizer)
        return clone

    def describe(self) -> dict:
        """What /health and the OpenAPI examples show: task, model, limits, an example item."""
        return {"task": self.task, "model": str(self.model_dir),
                "model_type": self.config.model_type, "backend": self.backend,
                "device": str(self.device), "precision": self.precision.name,
                "precision_reason": getattr(self.precision_choice, "reason", None),
                "max_length": self.max_length, "truncation": self.truncation,
                "example": self.example()}

    @abstractmethod
    def example(self) -> dict:
        """A valid request item, for documentation."""

    @abstractmethod
    def format_line(self, result: dict) -> str:
        """A result as ``bertforge predict MODE`` prints it for people (one line, one per mask
        for fill-mask), without the truncation note."""

    # -- shared machinery ---------------------------------------------------------------------
    @cached_property
    def input_names(self) -> tuple[str, ...]:
        """The model's inputs, as its family says (BERT also takes token types); looked up
        once, read for every batch."""
        return family_of_config(self.config).inputs

    def encode_text(self, text: str, pair: str | None = None) -> tuple[Window, bool]:
        """The window of ``text`` (and ``pair``) with special tokens, and whether it was cut to
        ``max_length`` (``InputError`` instead under ``truncation="error"``)."""
        # An encoder's tokenizer (BERT's, ModernBERT's) makes windows with offsets; BART's cuts.
        # Either reads no more of a long text than max_length needs (tokenization.prefix).
        if isinstance(self.tokenizer, EncoderTokenizer):
            capped = encode_window_capped(self.tokenizer, text, pair, self.max_length)
        elif pair is None:
            capped = encode_ids_capped(self.tokenizer, text, self.max_length)
        else:  # BART's pairs: counted whole, the first text cut (as encode_truncated does)
            n = len(self.tokenizer.encode(text, pair))
            capped = Capped(self.tokenizer.encode_truncated([text], self.max_length)[0], n, True)
        over = capped.length > self.max_length
        if over and self.truncation == "error":
            raise too_long(capped.length, self.max_length, pair is not None,
                           counted=capped.counted)
        window = capped.tokens
        if not isinstance(window, Window):
            window = Window(ids=window, type_ids=[0] * len(window), offsets=[], sequence_ids=[],
                            word_ids=[], source=0)
        return window, over

    def batch_width(self, lengths: Sequence[int]) -> int:
        """The padded width of a batch: its longest sequence rounded up to 8, within limits."""
        return min(-(-max(lengths) // 8) * 8, max(self.max_length, max(lengths)))

    def pad(self, windows: Sequence[Window]) -> dict[str, torch.Tensor]:
        """Model inputs of ``windows`` padded to ``batch_width``, on the pipeline's device."""
        width = self.batch_width([len(w.ids) for w in windows])
        if isinstance(self.tokenizer, EncoderTokenizer):
            arrays = self.tokenizer.pad_windows(windows, width)
        else:
            ids, mask = pad_rows([w.ids for w in windows], self.tokenizer.pad_id, width)
            arrays = {"input_ids": ids, "attention_mask": mask}
        return {k: torch.from_numpy(arrays[k]).to(self.device) for k in self.input_names}

    def forward(self, inputs: dict[str, torch.Tensor]) -> Any:
        """The model's output for ``inputs`` in inference mode and the pipeline's precision."""
        with torch.inference_mode(), self.precision.autocast():
            return self.model(**inputs)

    def mark(self, result: dict, request: Any) -> dict:
        """``result`` with ``"truncated": true`` when the request's input was cut, and
        ``"chunks": N`` when it was split into N > 1 windows."""
        if getattr(request, "truncated", False):
            result["truncated"] = True
        if len(getattr(request, "windows", ())) > 1:  # not every request has a window
            result["chunks"] = len(request.windows)
        return result


def _labels(config: Any) -> LabelMap:
    """The label names of config.json (id2label), else transformers' LABEL_i."""
    names = config.id2label or {i: f"LABEL_{i}" for i in range(config.num_labels)}
    return LabelMap([names[i] for i in range(config.num_labels)])


