"""``bertforge predict``: a fine-tuned model's predictions for new, unlabelled data.

The task and its data settings come from the run's config.yaml that ``bertforge finetune``
writes beside the model (else the task from config.json's ``finetuning_task``), and reading,
windowing and post-processing are the fine-tuning task's own, so a prediction is exactly what
evaluation would have produced for the same input.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from bertforge.config import FinetuneConfig, load_config
from bertforge.core.io import check_output_file
from bertforge.errors import ConfigError
from bertforge.models.loading import model_directory, open_model
from bertforge.tasks.registry import build_task, task_names, task_of_finetuned


def task_overrides(model: Path) -> list[str]:
    """Config overrides that select the task a model was fine-tuned for (config.json's
    ``finetuning_task``, as the task registry reads it)."""
    tuned = open_model(model_directory(model), "--model").config.finetuning_task
    spec = task_of_finetuned(tuned)
    if spec is None or spec.trainer is None:
        raise ConfigError(f"{model}/config.json does not say which task the model was fine-tuned "
                          f"for (finetuning_task={tuned!r}); fine-tune it with `bertforge "
                          f"finetune`, or pass --task={'|'.join(task_names('finetune'))}")
    if tuned.startswith("glue/"):
        return ["--task=glue", f"--data.task_name={tuned.split('/', 1)[1]}"]
    return [f"--task={spec.name}"]


def evaluation_config(model: Path, data: str | Path, output_dir: str | Path,
                      overrides: Sequence[str] = (), values: Mapping[str, Any] | None = None
                      ) -> FinetuneConfig:
    """The config of an evaluation-only run of ``model`` on ``data`` (``bertforge predict
    --data``, ``bertforge evaluate finetuned``). A `bertforge finetune` output holds its run's
    config.yaml: the same task and data settings (sequence length, doc stride, columns) the
    model was trained and evaluated with; else the task of config.json, unless ``overrides``
    (``--key=value``) name one. ``values``: typed, nested settings, as ``load_config`` takes."""
    run_config = model / "config.yaml"
    base = run_config if run_config.is_file() else None
    picked = [] if base or any(o.lstrip("-").startswith("task=") for o in overrides) else (
        task_overrides(model))
    return load_config(FinetuneConfig, base, [
        *picked, f"--model={model}", "--data.train=null", f"--data.validation={data}",
        "--data.validation_mismatched=null", "--data.max_eval_examples=null",
        f"--output_dir={output_dir}", *overrides], values=values)


def predict_file(model: Path, data: Path, output: Path, overrides: Sequence[str] = (),
                 values: Mapping[str, Any] | None = None) -> Path:
    """Predictions for ``data`` written atomically to ``output`` (SQuAD: id -> answer JSON;
    other tasks: JSON Lines with id and label/tags/summary). ``overrides`` (``--key=value``)
    and ``values`` (typed, nested) are fine-tuning config settings, as ``load_config`` takes."""
    from bertforge.train.run import distributed_run

    if not data.is_file():
        raise ConfigError(f"--data {data} does not exist")
    check_output_file(output, "--output")
    scratch = Path(tempfile.mkdtemp(prefix=".predict-", dir=output.parent))
    try:
        cfg = evaluation_config(model, data, scratch, overrides, values)
        with distributed_run(cfg, "predict") as info:
            task = build_task(cfg, info, labelled=False)
            task.evaluate_only()  # unlabelled: writes the predictions to scratch, no scores
        os.replace(scratch / task.prediction_file, output)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return output
