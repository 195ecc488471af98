"""The ``bertforge`` commands, each a typed config and the function that runs it.

One module per command or small group (``data``: vocab, prepare, inspect; ``train``: pretrain,
finetune; ``evaluate``; ``generate``; ``predict``; ``serve``: serve, export; ``tools``: convert,
plan, demo; ``bench``: inference speed per core). The command line (``bertforge.cli``) is
generated from :data:`COMMANDS`; these modules import nothing heavy until a command runs.
"""

from __future__ import annotations

from bertforge.commands.base import Command
from bertforge.commands.bench import BENCH
from bertforge.commands.data import INSPECT, PREPARE, VOCAB
from bertforge.commands.evaluate import EVALUATE
from bertforge.commands.generate import GENERATE
from bertforge.commands.mine import MINE
from bertforge.commands.predict import PREDICT
from bertforge.commands.serve import EXPORT, SERVE
from bertforge.commands.tools import CONVERT, DEMO, PLAN
from bertforge.commands.train import FINETUNE, PRETRAIN

# In the order of a user's journey (and of `bertforge --help`).
COMMANDS: tuple[Command, ...] = (VOCAB, PREPARE, INSPECT, CONVERT, PRETRAIN, FINETUNE, MINE,
                                 EVALUATE, GENERATE, PREDICT, SERVE, EXPORT, BENCH, PLAN, DEMO)

__all__ = ["COMMANDS", "Command"]
