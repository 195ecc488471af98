"""The tasks bertforge trains, predicts, serves and exports, one record each.

A record names everything a task is, so that every consumer looks it up here instead of keeping
its own list: its canonical name and the aliases it answers to (the names of earlier versions
and of the ``predict`` modes), the head kind its model needs (each model family maps head kinds
to classes, ``bertforge.models.registry``), the fine-tuning task class with its data reader and
batch maker, the metric and its primary key, the inference pipeline, the ``predict`` mode, the
server route with its request fields and the form of the served page, and the ONNX signature.

Canonical names are those of Hugging Face pipelines (``question-answering``,
``text-classification``, ...); the training names of earlier versions (``squad``, ``glue``,
``classification``, ``swag``) and the predict modes (``qa``, ``classify``, ``tag``, ``embed``,
``summarize``) are aliases. config.json's ``finetuning_task`` keeps the values it has always
had (``squad_v2``, ``glue/mrpc``, ...), so checkpoints are unchanged; ``finetuned_as`` maps them.

Implementation classes and functions are named by ``Ref``: reading this module imports no torch,
and the import-cycle test reads every ``Ref`` as an import, so the records cannot hide a cycle.
Adding a task is one record here plus its own module (tasks/<name>.py, and a pipeline module
when it is served). ``build_task`` makes the fine-tuning task object a config names (the
``finetune`` command, ``predict``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bertforge.core.refs import Ref
from bertforge.errors import ConfigError
from bertforge.tasks.settings import TaskSettings, settings_of

if TYPE_CHECKING:  # annotations only: reading the records imports no torch
    from bertforge.config import FinetuneConfig
    from bertforge.tasks.finetuning import FinetuneTask
    from bertforge.train.distributed import DistInfo

ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
"""The graph inputs of every exported encoder head: (batch, sequence) int64."""
SEQUENCE = "sequence"
"""A dynamic sequence axis in ``Export.outputs`` (the batch axis is always dynamic)."""


@dataclass(frozen=True)
class Export:
    """The ONNX signature of a task's model (its inputs are ``ENCODER_INPUTS``): outputs named
    after the fields of the head's output dataclass (``output_type``, which ``OnnxModel``
    rebuilds), each with its shape without the batch axis: ``SEQUENCE`` or the name of a config
    attribute."""

    output_type: Ref
    outputs: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.outputs)

    def output_dims(self, config: object) -> dict[str, tuple[int, ...]]:
        """``{output: shape without the batch axis}`` for a model of ``config``; -1 marks the
        sequence axis (Triton's notation for a variable dimension)."""
        return {name: tuple(-1 if d == SEQUENCE else int(getattr(config, d)) for d in dims)
                for name, dims in self.outputs}


@dataclass(frozen=True)
class Serving:
    """How the server and the page offer a task. The request schema is the pipeline's: its
    ``fields`` and the checks of its ``parse``."""

    route: str
    """POST path of the task's endpoint."""
    form: str = "text"
    """The page's form: "question-context" (two boxes) or "text"."""
    tei_kind: str | None = None
    """The ``model_type`` text-embeddings-inference's ``/info`` gives a model of this task
    ("embedding", "classifier"); None where TEI has none: ``/info`` then names the task."""


@dataclass(frozen=True)
class TaskSpec:
    name: str
    """Canonical name (a Hugging Face pipeline name)."""
    summary: str
    """One line on what it trains or does: ``--task``'s help and the task listings
    (:func:`task_help`)."""
    head: str
    """Head kind the model needs (``bertforge.models.registry.HEAD_KINDS``)."""
    seq2seq: bool | None = False
    """The model must be an encoder-decoder (True), encoder-only (False) or either (None)."""
    aliases: tuple[str, ...] = ()
    """Other names accepted wherever a task is named (earlier versions' and predict modes')."""
    trainer: Ref | None = None
    """The task class of the one runner (``bertforge.train.task.Task``); None: not trainable."""
    command: str = "finetune"
    """The command that trains it: "finetune", or "pretrain" (chosen by the data's objective)."""
    objectives: tuple[str, ...] = ()
    """pretrain tasks: the prepared data objectives they train on (``bertforge prepare``)."""
    reader: Ref | None = None
    """Reads the task's files into examples."""
    batches: Ref | None = None
    """The batch maker (``bertforge.data.collate``) of its training micro-batches; the tasks
    build theirs from it (masked-LM's is the pretraining loader's default, built there with the
    masking settings)."""
    metric: Ref | None = None
    """Scores predictions against references."""
    primary_metric: str | None = None
    """The metric key that ranks runs (``finetune --seeds`` reports its median first)."""
    pipeline: Ref | None = None
    """The inference pipeline (``predict``, ``serve``); None: not served."""
    predict_mode: str | None = None
    """The mode of ``bertforge predict MODE``."""
    serving: Serving | None = None
    export: Export | None = None
    max_length: int = 128
    """Default tokens per input (``data.max_seq_length`` when unset), at most the model's."""
    finetuned_as: tuple[str, ...] = field(default=())
    """config.json ``finetuning_task`` values of models fine-tuned for it (a trailing "/"
    matches a prefix, e.g. "glue/" for "glue/mrpc")."""

    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def settings(self) -> TaskSettings | None:
        """The task's own section of the fine-tuning config (``embedding.*``), if it has one;
        declared in ``bertforge.tasks.settings``, which the config reads."""
        return settings_of(self.name)


def _bert_output(name: str) -> Ref:
    return Ref("bertforge.models.outputs", name)


TASKS: tuple[TaskSpec, ...] = (
    TaskSpec(
        name="question-answering", summary="extractive question answering (SQuAD v1.1 / v2.0)",
        head="question-answering", aliases=("squad", "qa"),
        trainer=Ref("bertforge.tasks.squad", "SquadTask"),
        reader=Ref("bertforge.data.finetuning.squad", "read_squad"),
        batches=Ref("bertforge.data.batch", "SequenceFeatures"),
        metric=Ref("bertforge.metrics.squad", "score_v1"), primary_metric="f1",
        pipeline=Ref("bertforge.inference.pipelines.qa", "QuestionAnsweringPipeline"),
        predict_mode="qa",
        serving=Serving("/v1/question-answering", "question-context"),
        export=Export(_bert_output("QuestionAnsweringOutput"),
                      (("start_logits", (SEQUENCE,)), ("end_logits", (SEQUENCE,)))),
        max_length=384, finetuned_as=("squad", "squad_v2")),
    TaskSpec(
        name="text-classification",
        summary="single-text or text-pair classification and regression (GLUE, your data)",
        head="sequence-classification",
        aliases=("classification", "glue", "classify", "sentiment-analysis"),
        trainer=Ref("bertforge.tasks.classify", "ClassificationTask"),
        reader=Ref("bertforge.data.finetuning.tables", "read_classification"),
        batches=Ref("bertforge.data.batch", "SequenceFeatures"),
        metric=Ref("bertforge.metrics.classification", "classification_metrics"),
        primary_metric="accuracy",
        pipeline=Ref("bertforge.inference.pipelines.encoders", "TextClassificationPipeline"),
        predict_mode="classify",
        serving=Serving("/v1/text-classification", tei_kind="classifier"),
        export=Export(_bert_output("ClassifierOutput"), (("logits", ("num_labels",)),)),
        finetuned_as=("classification", "glue/")),
    TaskSpec(
        name="token-classification", summary="a label per word (named entities, CoNLL-2003)",
        head="token-classification", aliases=("tag", "ner"),
        trainer=Ref("bertforge.tasks.tagging", "TokenClassificationTask"),
        reader=Ref("bertforge.data.finetuning.conll", "read_token_tags"),
        batches=Ref("bertforge.data.batch", "SequenceFeatures"),
        metric=Ref("bertforge.metrics.seqeval", "entity_scores"), primary_metric="f1",
        pipeline=Ref("bertforge.inference.pipelines.encoders", "TokenClassificationPipeline"),
        predict_mode="tag", serving=Serving("/v1/token-classification"),
        export=Export(_bert_output("ClassifierOutput"),
                      (("logits", (SEQUENCE, "num_labels")),)),
        finetuned_as=("token-classification",)),
    TaskSpec(
        name="multiple-choice", summary="pick the right ending among several (SWAG)",
        head="multiple-choice", aliases=("swag",),
        trainer=Ref("bertforge.tasks.swag", "MultipleChoiceTask"),
        reader=Ref("bertforge.data.finetuning.swag", "read_swag"),
        batches=Ref("bertforge.data.collate.choices", "ChoiceFeatures"),
        metric=Ref("bertforge.metrics.classification", "accuracy"), primary_metric="accuracy",
        finetuned_as=("swag",)),
    TaskSpec(
        name="summarization", summary="abstractive summarization with BART (beam search, ROUGE)",
        head="seq2seq-lm", seq2seq=True, aliases=("summarize",),
        trainer=Ref("bertforge.tasks.summarize", "SummarizationTask"),
        reader=Ref("bertforge.data.finetuning.summarization", "read_summarization"),
        batches=Ref("bertforge.data.collate.seq2seq", "PairFeatures"),
        metric=Ref("bertforge.metrics.rouge", "rouge_scores"), primary_metric="rougeL",
        pipeline=Ref("bertforge.inference.pipelines.summarize", "SummarizationPipeline"),
        predict_mode="summarize",
        serving=Serving("/v1/summarization"),
        max_length=1024, finetuned_as=("summarization",)),
    TaskSpec(
        name="fill-mask", summary="the most likely tokens for each [MASK] (<mask> for BART)",
        head="masked-lm", seq2seq=None, aliases=("mlm-predict",),
        pipeline=Ref("bertforge.inference.pipelines.encoders", "FillMaskPipeline"),
        predict_mode="fill-mask", serving=Serving("/v1/fill-mask"),
        export=Export(_bert_output("MaskedLMOutput"), (("logits", (SEQUENCE, "vocab_size")),))),
    TaskSpec(
        name="feature-extraction", summary="a vector per text (mean or first-token pooling)",
        head="base", seq2seq=None, aliases=("embed", "embeddings"),
        pipeline=Ref("bertforge.inference.pipelines.features", "FeatureExtractionPipeline"),
        predict_mode="embed", serving=Serving("/v1/embeddings", tei_kind="embedding"),
        export=Export(Ref("bertforge.models.outputs", "BertModelOutput"),
                      (("last_hidden_state", (SEQUENCE, "hidden_size")),
                       ("pooler_output", ("hidden_size",))))),
    TaskSpec(
        name="sentence-similarity",
        summary="embedding models: in-batch and hard negatives, CoSENT, Matryoshka, MarginMSE",
        head="base", aliases=("embedding", "contrastive"),
        trainer=Ref("bertforge.tasks.embedding", "SentenceSimilarityTask"),
        reader=Ref("bertforge.data.finetuning.pairs", "read_pairs"),
        batches=Ref("bertforge.data.collate.texts", "TextGroups"),
        metric=Ref("bertforge.metrics.retrieval", "retrieval_metrics"), primary_metric="ndcg@10"),
    TaskSpec(
        name="text-ranking", summary="rerankers (cross-encoders): pointwise BCE or listwise",
        head="sequence-classification", aliases=("reranker", "rerank"),
        trainer=Ref("bertforge.tasks.ranking", "TextRankingTask"),
        reader=Ref("bertforge.data.finetuning.pairs", "read_ranking"),
        batches=Ref("bertforge.data.batch", "SequenceFeatures"),
        metric=Ref("bertforge.metrics.retrieval", "retrieval_metrics"), primary_metric="ndcg@10",
        pipeline=Ref("bertforge.inference.pipelines.encoders", "TextRankingPipeline"),
        predict_mode="rerank", serving=Serving("/v1/text-ranking", tei_kind="reranker"),
        export=Export(_bert_output("ClassifierOutput"), (("logits", ("num_labels",)),)),
        max_length=256, finetuned_as=("text-ranking",)),
    TaskSpec(
        name="masked-lm", summary="BERT pretraining: masked LM, with NSP or SOP on sentence pairs",
        head="pretraining", aliases=("pretraining", "mlm"), command="pretrain",
        objectives=("nsp", "sop", "none"),
        trainer=Ref("bertforge.tasks.mlm", "PretrainTask"),
        batches=Ref("bertforge.data.collate.mlm", "MicroBatchMaker"),
        primary_metric="val_loss"),
    TaskSpec(
        name="denoising", summary="BART pretraining: text infilling and sentence permutation",
        head="seq2seq-lm", seq2seq=True, aliases=("denoise",), command="pretrain",
        objectives=("denoise",),
        trainer=Ref("bertforge.tasks.denoise", "DenoiseTask"),
        batches=Ref("bertforge.data.collate.seq2seq", "DenoisingBatchMaker"),
        primary_metric="val_loss"),
)


def _index() -> dict[str, TaskSpec]:
    out: dict[str, TaskSpec] = {}
    for spec in TASKS:
        for name in spec.names():
            if name in out:
                raise AssertionError(f"task name {name} is used twice")
            out[name] = spec
    return out


_BY_NAME = _index()


def check_model_fits_task(spec: TaskSpec, family: object, model: str,
                          given: str | None = None) -> None:
    """ConfigError unless a model of ``family`` (a ``FamilySpec``) can do task ``spec`` (named
    ``given`` by the user): the right kind of model (encoder-only or encoder-decoder) with the
    head the task needs."""
    name = given or spec.name
    wanted = spec.seq2seq
    if wanted is not None and wanted != family.seq2seq:
        kind = "an encoder-decoder model (BART)" if wanted else "an encoder-only model (BERT)"
        raise ConfigError(f"model={model} is a {family.name} model but task {name} needs {kind}")
    if spec.head not in family.heads:
        able = [t.name for t in TASKS if t.head in family.heads and t.seq2seq in (None,
                                                                              family.seq2seq)]
        raise ConfigError(f"model={model} is a {family.name} model, which has no {spec.head} "
                          f"head for task {name}; {family.name} models do {', '.join(able)}")


def build_task(cfg: FinetuneConfig, info: DistInfo, labelled: bool = True) -> FinetuneTask:
    """The task object for ``cfg.task`` (``labelled=False``: predict, do not score). The model's
    config.json is read here, once, and handed to the task."""
    from bertforge.models.loading import open_model  # torch: only once a task is built

    spec = get_task(cfg.task, command="finetune")
    if not cfg.model:
        raise ConfigError("model is not set: give --model=DIR (a Hugging Face BERT or BART "
                          "directory, or a bertforge checkpoint)")
    source = open_model(cfg.model)  # a preset or config.json is refused by the task
    check_model_fits_task(spec, source.family, str(cfg.model), given=cfg.task)
    return spec.trainer.load()(cfg, info, spec, source, labelled)


def _allowed(command: str | None, served: bool) -> list[TaskSpec]:
    """The tasks ``command`` trains (all when None), only the served ones if ``served``."""
    return [t for t in TASKS if (command is None or (t.trainer and t.command == command))
            and (not served or t.pipeline is not None)]


def task_names(command: str | None = None, served: bool = False) -> list[str]:
    """Canonical names, optionally only those ``command`` trains or the served ones."""
    return [t.name for t in _allowed(command, served)]


def task_help(command: str | None = None, served: bool = False) -> str:
    """A line per task (those ``command`` trains, or the served ones): its name, its summary and
    its aliases; ``--task``'s help."""
    allowed = _allowed(command, served)
    pad = max(len(t.name) for t in allowed) + 2
    return "\n".join(f"{t.name:<{pad}}{t.summary}"
                     + (f"; aliases {', '.join(t.aliases)}" if t.aliases else "") for t in allowed)


def task_choices(command: str | None = None, served: bool = False) -> str:
    """"a, b or c": the canonical names of those tasks, for a one-line option help."""
    names = task_names(command, served)
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def get_task(name: str, key: str = "task", command: str | None = None,
             served: bool = False) -> TaskSpec:
    """The record of a task by its name or an alias; ConfigError naming ``key``, the valid
    names and the closest one. ``command``: it must be trainable by that command; ``served``: it
    must have an inference pipeline."""
    spec = _BY_NAME.get(name)
    allowed = _allowed(command, served)
    if spec is None or spec not in allowed:
        names = [n for t in allowed for n in t.names()]
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        what = "an unknown task" if spec is None else f"not a task {command or 'serving'} does"
        raise ConfigError(f"{key}={name!r} is {what}.{hint} Choose one of "
                          f"{', '.join(t.name for t in allowed)} (aliases: "
                          f"{', '.join(a for t in allowed for a in t.aliases)})")
    return spec


def task_of_objective(objective: str) -> TaskSpec:
    """The pretraining task for prepared data of ``objective``."""
    for spec in TASKS:
        if objective in spec.objectives:
            return spec
    raise ConfigError(f"prepared data objective {objective!r} has no pretraining task; "
                      f"known: {', '.join(o for t in TASKS for o in t.objectives)}")


def task_of_finetuned(value: str | None) -> TaskSpec | None:
    """The task a config.json ``finetuning_task`` value means, or None."""
    if not value:
        return None
    for spec in TASKS:
        for tag in spec.finetuned_as:
            if value == tag or (tag.endswith("/") and value.startswith(tag)):
                return spec
    return None


def task_of_head(head: str) -> TaskSpec | None:
    """The served task whose model is a ``head`` model (what a bare config.json's
    ``architectures`` tells), or None."""
    for spec in TASKS:
        if spec.head == head and spec.pipeline is not None:
            return spec
    return None


def predict_modes() -> dict[str, str]:
    """``bertforge predict`` mode -> canonical task name."""
    return {t.predict_mode: t.name for t in TASKS if t.predict_mode}


__all__ = ["ENCODER_INPUTS", "Export", "SEQUENCE", "Serving", "TASKS", "TaskSpec",
           "build_task", "check_model_fits_task", "get_task",
           "predict_modes", "task_choices", "task_help", "task_names", "task_of_finetuned",
           "task_of_head", "task_of_objective"]
