"""Readers of fine-tuning data: every supported layout in, a few example types out.

* ``read_classification``: the user's own CSV/TSV/JSON Lines sentence (pair) data;
* ``read_glue``: the nine GLUE tasks, from GLUE's original files or named-column exports;
* ``read_swag``: SWAG multiple choice;
* ``read_token_tags``: CoNLL-style or JSON Lines token tagging.

Readers only read: a problem with the data raises ``DataError`` naming the file and line before
anything is built from it. ``LabelMap`` fixes the order of class ids.
"""

from __future__ import annotations

from bertforge.data.finetuning.conll import read_token_tags
from bertforge.data.finetuning.examples import ChoiceExample, TaggedExample, TextExample
from bertforge.data.finetuning.glue import GLUE_TASKS, GlueTask, glue_task, read_glue
from bertforge.data.finetuning.labels import LabelMap
from bertforge.data.finetuning.swag import read_swag
from bertforge.data.finetuning.tables import Row, Table, read_classification, read_table

__all__ = [
    "GLUE_TASKS", "ChoiceExample", "GlueTask", "LabelMap", "Row", "Table", "TaggedExample",
    "TextExample", "glue_task", "read_classification", "read_glue", "read_swag", "read_table",
    "read_token_tags",
]
