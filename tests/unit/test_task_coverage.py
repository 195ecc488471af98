"""Every registered task has an end-to-end test: a table of task -> the pytest node ids that run
it whole, checked against the task registry and against the test files (read with ``ast``, not
run). A new task fails here until its end-to-end test is written and named below."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bertforge.tasks.registry import TASKS

ROOT = Path(__file__).resolve().parents[2]
FINETUNE = "tests/integration/test_finetune.py::test_every_task_writes_its_outputs_and_an_hf_model"

# Trainable tasks: node ids that train the task through the runner and evaluate the result
# (validation metrics, eval_results.json, or the trained model checked against a reference).
TRAINED: dict[str, list[str]] = {
    "question-answering": [f"{FINETUNE}[squad-v1]", f"{FINETUNE}[squad-v2]"],
    "text-classification": [f"{FINETUNE}[mrpc]", f"{FINETUNE}[stsb]", f"{FINETUNE}[reviews]"],
    "token-classification": [f"{FINETUNE}[conll]"],
    "multiple-choice": [f"{FINETUNE}[swag]"],
    "summarization": [
        "tests/integration/test_summarization.py::"
        "test_lead_task_is_learned_and_every_command_agrees"],
    "sentence-similarity": [
        "tests/integration/test_embedding_training.py::"
        "test_training_improves_retrieval_on_held_out_sentences",
        "tests/integration/test_embedding_training.py::"
        "test_the_issue_command_trains_a_model_sentence_transformers_loads"],
    "text-ranking": [
        "tests/integration/test_ranking_training.py::"
        "test_cross_encoder_loads_the_reranker_with_the_served_scores",
        "tests/integration/test_ranking_training.py::"
        "test_a_reranker_learns_to_rank_held_out_passages[listwise]"],
    "masked-lm": ["tests/integration/test_pretrain.py::test_finished_run_outputs",
                  "tests/integration/test_pretrain.py::test_golden_losses_of_the_debug_recipe"],
    "denoising": [
        "tests/integration/test_bart_pretrain.py::"
        "test_denoising_loss_falls_and_the_checkpoint_is_a_bart"],
}

# Tasks that are only served (no trainer): node ids that run the task on a model the suite
# trained or built, through predict/serve, checked against a reference implementation.
SERVED: dict[str, list[str]] = {
    "fill-mask": [
        "tests/integration/test_fill_mask.py::"
        "test_a_pretrained_checkpoint_fills_masks_as_transformers_does"],
    "feature-extraction": [
        "tests/integration/test_embedding_training.py::"
        "test_the_issue_command_trains_a_model_sentence_transformers_loads",
        "tests/integration/test_sentence_transformers.py::"
        "test_sentence_transformers_loads_the_export_with_the_same_vectors"],
}


def missing_tests(node_id: str) -> str | None:
    """Why ``node_id`` names no test (None if it does): the file, a module-level test function
    of that name, and for a ``[case]`` a string constant of the module that is the case's id or
    the start of it (pytest's id of a parametrized case begins with its first value)."""
    path, _, name = node_id.partition("::")
    name, _, case = name.partition("[")
    file = ROOT / path
    if not file.is_file():
        return f"{path} does not exist"
    tree = ast.parse(file.read_text())
    functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef,
                                                           ast.AsyncFunctionDef))}
    if not name.startswith("test_") or name not in functions:
        return f"{path} has no test function {name}"
    case = case.removesuffix("]")
    texts = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
             and isinstance(n.value, str)}
    if case and not any(case == t or case.startswith(t + "-") for t in texts):
        return f"{path}::{name} has no case {case!r}"
    return None


def test_every_registered_task_has_an_end_to_end_test() -> None:
    trainable = {t.name for t in TASKS if t.trainer is not None}
    served_only = {t.name for t in TASKS if t.trainer is None}
    assert set(TRAINED) == trainable, "a trainable task needs a train+evaluate test in TRAINED"
    assert set(SERVED) == served_only, "a served-only task needs an end-to-end test in SERVED"


@pytest.mark.parametrize("node_id", sorted({n for ids in [*TRAINED.values(), *SERVED.values()]
                                            for n in ids}))
def test_each_named_test_exists(node_id: str) -> None:
    assert missing_tests(node_id) is None, missing_tests(node_id)


def test_a_wrong_name_is_caught() -> None:
    assert missing_tests("tests/integration/test_nope.py::test_x") is not None
    assert "no test function" in missing_tests(f"{FINETUNE}_typo[swag]")
    assert "no case 'sst2'" in missing_tests(f"{FINETUNE}[sst2]")
    assert missing_tests(f"{FINETUNE}[swag]") is None
