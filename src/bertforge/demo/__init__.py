"""``bertforge demo``: the whole journey on a bundled sample (``run``), built from the docstrings of
Python's standard library (``corpus``: pretraining text; ``qa_data``: SQuAD-style questions)."""

from bertforge.demo.run import run_demo

__all__ = ["run_demo"]
