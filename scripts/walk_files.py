#!/usr/bin/env python3
"""Which bertforge files one SQuAD fine-tuning run walks through, from ``bertforge finetune``
to eval_results.json: the number a reader following the run has to open.

Runs a tiny SQuAD fine-tuning (2-layer BERT built here, 2 steps, CPU) in this process under
``sys.setprofile`` and counts the files whose functions run. Code that runs while a bertforge
module is being imported (module and class bodies) is not counted: that is reading, not the
walk. Reported:

* orchestration files: those outside the leaf layers (core, errors, ops, models,
  tokenization, metrics: kernels, model code and tools a run calls and returns from);
* climbs: calls from a file into a file of a higher layer (``bertforge.core.layers``), by kind:
  the runner driving its task through the Task protocol (``train -> tasks``), speed applied
  from outside (a model's submodule whose class ``bertforge.speed`` swapped), core's wrappers
  and callbacks (a ``checked`` decorator calling what it wraps, an atomic writer calling the
  function that writes the file, the config schema calling a dataclass's checks), a model's
  ``save_pretrained`` writing the tokenizer handed to it (``tokenizer.save``), and the
  rest ("other": a lower layer reaching up, which the walk should not have).

usage: python scripts/walk_files.py [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

import bertforge
from bertforge.core.layers import layer_of

ROOT = os.path.dirname(bertforge.__file__)
ASSETS = Path(__file__).resolve().parents[1] / "tests" / "assets"
LEAF_LAYERS = ("core/", "errors.py", "ops/", "models/", "tokenization/", "metrics/")


def make_model(root: Path) -> Path:
    from bertforge.models import BertConfig, BertForPreTraining
    from bertforge.tokenization import BertTokenizer
    from bertforge.tokenization.training import train_wordpiece

    vocab = root / "vocab.txt"
    train_wordpiece([ASSETS / "tiny_corpus.txt"], vocab_size=1000, output=vocab, progress=False)
    tokenizer = BertTokenizer.from_file(vocab)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    BertForPreTraining(config).save_pretrained(root / "model", tokenizer=tokenizer)
    return root / "model"


def layer(file: str) -> int | None:
    return layer_of("bertforge." + file[:-3].replace("/", ".").removesuffix(".__init__"))


def trace(argv: list[str]) -> tuple[list[str], collections.Counter]:
    """(the files entered, in first-entry order; calls between files)."""
    from bertforge.cli import main

    order: list[str] = []
    calls: collections.Counter = collections.Counter()

    def ours(frame) -> bool:
        return frame.f_code.co_filename.startswith(ROOT)

    def profile(frame, event, arg) -> None:
        if event != "call" or not ours(frame):
            return
        up = frame
        while up is not None:  # import time: a bertforge module body is on the stack
            if up.f_code.co_name == "<module>" and ours(up):
                return
            up = up.f_back
        callee = os.path.relpath(frame.f_code.co_filename, ROOT)
        if callee not in order:
            order.append(callee)
        back = frame.f_back
        while back is not None and not ours(back):
            back = back.f_back
        if back is not None:
            caller = os.path.relpath(back.f_code.co_filename, ROOT)
            if caller != callee:
                calls[(caller, callee)] += 1

    sys.setprofile(profile)
    try:
        code = main(argv)
    finally:
        sys.setprofile(None)
    if code:
        raise SystemExit(f"bertforge {' '.join(argv)} failed (exit {code})")
    return order, calls


def kind_of_climb(caller: str, callee: str) -> str:
    if caller.startswith("train/") and callee.startswith("tasks/"):
        return "task protocol"
    if callee == "speed.py" and caller.startswith("models/"):
        return "speed swap"
    if caller.startswith("core/"):
        return "core wrapper or callback"  # a checked() decorator, an atomic writer's callback
    if caller == "models/hub.py" and callee.startswith("tokenization/"):
        # save_pretrained(directory, tokenizer=...) writes the files of the tokenizer it is
        # handed (tokenizer.save): a callback; models import nothing of tokenization.
        return "tokenizer handed to save_pretrained"
    return "other"


def measure() -> dict:
    """The walk of the tiny SQuAD run: {"files", "orchestration_files", "walk", "climbs"}."""
    root = Path(tempfile.mkdtemp(prefix="walk-"))
    try:
        model = make_model(root)
        squad = ASSETS / "squad" / "v1_sample.json"
        argv = ["finetune", "--task=squad", f"--data.train={squad}", f"--data.validation={squad}",
                "--data.max_seq_length=64", "--data.doc_stride=16", "--data.max_query_length=16",
                f"--model={model}", f"--output_dir={root / 'out'}", "--train.max_steps=2",
                "--train.global_batch_size=4", "--train.micro_batch_size=2", "--precision=fp32",
                "--tensorboard=false", "--eval.batch_size=3"]
        order, calls = trace(argv)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    walk = [f for f in order if not f.startswith(LEAF_LAYERS)]
    climbs: dict[str, list[str]] = collections.defaultdict(list)
    for (caller, callee), n in sorted(calls.items()):
        up, down = layer(caller), layer(callee)
        if up is not None and down is not None and up < down:
            climbs[kind_of_climb(caller, callee)].append(f"{caller} -> {callee} ({n})")
    passing_on = {caller for caller, _ in calls}  # files that hand control to another file
    return {"files": len(order), "orchestration_files": len(walk), "walk": walk,
            "walk_passing_on": [f for f in walk if f in passing_on], "climbs": dict(climbs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['files']} bertforge files run; {result['orchestration_files']} "
          "orchestration files:")
    print("  " + ", ".join(result["walk"]))
    passing = result["walk_passing_on"]
    rest = [f for f in result["walk"] if f not in passing]
    print(f"of which {len(passing)} call on into another bertforge file; the rest are called "
          f"and return: {', '.join(rest)}")
    for kind, items in result["climbs"].items():
        print(f"climbs, {kind}: {len(items)}")
        for item in items:
            print(f"  {item}")


if __name__ == "__main__":
    main()
