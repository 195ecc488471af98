"""Every registered model family has its proofs (tests/family_proofs.py): a parity test against
transformers and an end-to-end fine-tuning run, each naming a test that exists. Checked from the
source with ``ast``; the named tests themselves run in their own files."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

from family_proofs import PROOF_KINDS, PROOFS

from bertforge.models.registry import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
# What the file of each kind of proof must mention: the library it compares with, the run.
EVIDENCE = {"parity": "transformers", "finetune": "finetune"}


@cache
def defined_tests(path: Path) -> frozenset[str]:
    """Test functions of a test file as pytest names them: ``test_x`` and ``TestY::test_x``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(f"{node.name}::{item.name}" for item in node.body
                         if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return frozenset(n for n in names if n.rpartition("::")[2].startswith("test"))


def node_problem(node: str, kind: str) -> str | None:
    """Why ``node`` cannot be a ``kind`` proof, or None."""
    file, _, name = node.partition("::")
    path = ROOT / file
    if not file.startswith("tests/") or not path.is_file():
        return f"{node}: no such test file"
    if name not in defined_tests(path):
        return f"{node}: {file} defines no test {name!r}"
    if EVIDENCE[kind] not in path.read_text(encoding="utf-8"):
        return f"{node}: {file} never mentions {EVIDENCE[kind]}, so it is no {kind} proof"
    return None


def proof_problems(families: Iterable[str], proofs: Mapping[str, Mapping[str, Iterable[str]]]
                   ) -> list[str]:
    """One line per missing or broken proof of the families called ``families``."""
    families = list(families)
    problems = [f"{name}: no family of that name is registered" for name in proofs
                if name not in families]
    for name in families:
        entry = proofs.get(name)
        if entry is None:
            problems.append(f"{name}: no entry in tests/family_proofs.py")
            continue
        problems += [f"{name}: unknown proof kind {kind!r}" for kind in entry
                     if kind not in PROOF_KINDS]
        for kind in PROOF_KINDS:
            nodes = list(entry.get(kind, ()))
            if not nodes:
                problems.append(f"{name}: no {kind} test")
            problems += [p for p in (node_problem(n, kind) for n in nodes) if p]
    return problems


def test_every_registered_family_has_a_parity_and_a_finetuning_proof() -> None:
    assert proof_problems([f.name for f in FAMILIES], PROOFS) == []


def test_a_family_without_its_proofs_or_with_a_missing_test_is_caught() -> None:
    bert = PROOFS["BERT"]
    assert proof_problems(["BERT", "Electra"], {"BERT": bert}) == [
        "Electra: no entry in tests/family_proofs.py"]
    assert proof_problems(["BERT"], {"BERT": {"parity": bert["parity"]}}) == [
        "BERT: no finetune test"]
    assert proof_problems([], {"BERT": bert}) == ["BERT: no family of that name is registered"]
    wrong = {"parity": ("tests/parity/test_hf_parity.py::test_no_such_thing",
                        "tests/parity/test_nothing_here.py::test_x"),
             "finetune": ("tests/unit/test_lamb.py::test_trust_ratio_zero_weights_uses_one",),
             "speed": ()}
    assert proof_problems(["BERT"], {"BERT": wrong}) == [
        "BERT: unknown proof kind 'speed'",
        "tests/parity/test_hf_parity.py::test_no_such_thing: tests/parity/test_hf_parity.py "
        "defines no test 'test_no_such_thing'",
        "tests/parity/test_nothing_here.py::test_x: no such test file",
        "tests/unit/test_lamb.py::test_trust_ratio_zero_weights_uses_one: tests/unit/test_lamb.py "
        "never mentions finetune, so it is no finetune proof"]


def test_tests_inside_classes_are_named_the_way_pytest_names_them(tmp_path: Path) -> None:
    file = tmp_path / "test_sample.py"
    file.write_text("class TestA:\n    def test_b(self):\n        pass\n    def helper(self):\n"
                    "        pass\n\ndef test_c():\n    pass\n\ndef fixture_d():\n    pass\n")
    assert defined_tests(file) == {"TestA::test_b", "test_c"}
