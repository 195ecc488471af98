"""docs/python.md is run: every ```python block, alone and in a fresh namespace, in a directory
holding tiny random-weight models at the paths the page uses (the convention its header states).
A ```python skip block is compiled and its bertforge imports resolved. The page must keep an
example for every task, the tokenizer call and generation."""

from __future__ import annotations

import ast
import importlib
import re
import shutil
from pathlib import Path

import pytest
import torch

from bertforge.models import (BertConfig, BertForPreTraining, BertForQuestionAnswering,
                              BertForSequenceClassification, BertForTokenClassification)
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

PAGE = Path(__file__).resolve().parents[2] / "docs" / "python.md"
FENCE = re.compile(r"^```(python[^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!'-;:")
WORDS = "the a of was by in is it who wrote note written cat dog sat paris london".split()
SHAPE = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=128)


def blocks() -> list[tuple[int, str, str]]:
    """(line, info string, code) of every python block of the page."""
    text = PAGE.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1).strip(), m.group(2))
            for m in FENCE.finditer(text)]


RUN = [pytest.param(code, id=f"line{line}") for line, info, code in blocks() if info == "python"]
SKIP = [pytest.param(code, id=f"line{line}") for line, info, code in blocks()
        if info == "python skip"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, tiny_bart: Path) -> Path:
    """runs/squad, runs/sst2, runs/conll, runs/bert and runs/cnndm-bart-large, as the page's
    header says."""
    root = tmp_path_factory.mktemp("docs-python")
    tok = BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *WORDS, *CHARS,
                                            *[f"##{c}" for c in CHARS]])))
    base = BertConfig(vocab_size=tok.vocab_size, **SHAPE)
    torch.manual_seed(0)
    built = {
        "squad": BertForQuestionAnswering(base.replace(finetuning_task="squad")),
        "sst2": BertForSequenceClassification(base.replace(
            num_labels=2, id2label={0: "negative", 1: "positive"}, finetuning_task="glue/sst2")),
        "conll": BertForTokenClassification(base.replace(
            num_labels=5, id2label={0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"},
            finetuning_task="token-classification")),
        "bert": BertForPreTraining(base),
    }
    for name, model in built.items():
        model.save_pretrained(root / "runs" / name, tokenizer=tok)
    shutil.copytree(tiny_bart, root / "runs" / "cnndm-bart-large")
    return root


@pytest.mark.parametrize("code", RUN)
def test_the_python_blocks_run(code: str, workdir: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(workdir)
    exec(compile(code, str(PAGE), "exec"), {"__name__": "__docs__"})


@pytest.mark.parametrize("code", SKIP)
def test_the_blocks_not_run_compile_and_import(code: str):
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] == "bertforge":
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert getattr(module, alias.name, None) is not None, (node.module, alias.name)


def test_the_page_shows_every_task_the_tokenizer_call_and_generation():
    code = "\n".join(c for _, info, c in blocks() if info == "python")
    for task in ("question-answering", "sentiment-analysis", "ner", "fill-mask", "summarization",
                 "feature-extraction"):
        assert f'bertforge.pipeline("{task}"' in code, task
    assert re.search(r"\btok\(\[.*padding=True", code, re.DOTALL)
    assert "generate(model" in code and len(RUN) >= 9
