"""The proofs every model family owes, by family (``FamilySpec.name``): the tests that show its
models compute what transformers' do (``parity``: weights moved between the two libraries give
the same logits) and that it fine-tunes end to end through the runner (``finetune``: a tiny
model trained by `finetune`, its outputs checked).

tests/unit/test_family_proofs.py fails when a family of ``bertforge.models.registry.FAMILIES``
has no entry here, an entry lacks either proof, or a named test does not exist: a new family
record cannot land without both. Node ids are pytest's, relative to the repository root
(``tests/FILE.py::FUNCTION``, or ``tests/FILE.py::CLASS::METHOD``); parametrized tests are
named without their parameters.
"""

from __future__ import annotations

PROOF_KINDS = ("parity", "finetune")

PROOFS: dict[str, dict[str, tuple[str, ...]]] = {
    "BERT": {
        "parity": (
            "tests/parity/test_hf_parity.py::test_transformers_dir_loads_in_bertforge",
            "tests/parity/test_hf_parity.py::test_bertforge_dir_loads_in_transformers",
        ),
        "finetune": (
            # every fine-tuning task; the result loads in transformers with the same logits
            "tests/integration/test_finetune.py::"
            "test_every_task_writes_its_outputs_and_an_hf_model",
        ),
    },
    "BART": {
        "parity": (
            "tests/parity/test_bart_parity.py::test_conditional_generation_logits_match",
            "tests/parity/test_bart_parity.py::test_bare_model_and_classifier_match",
        ),
        "finetune": (
            # summarization learned to ROUGE-1 > 60; generate/predict/transformers agree
            "tests/integration/test_summarization.py::"
            "test_lead_task_is_learned_and_every_command_agrees",
        ),
    },
    "ModernBERT": {
        "parity": (
            "tests/parity/test_modernbert_parity.py::test_bertforge_to_transformers",
            "tests/parity/test_modernbert_parity.py::test_transformers_to_bertforge",
        ),
        "finetune": (
            "tests/integration/test_modernbert_runs.py::"
            "test_fine_tuning_every_encoder_task_and_its_pipeline",
        ),
    },
}
