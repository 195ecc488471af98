"""The layers of bertforge, low to high. A module imports from its own layer and the ones below,
never from one above: imports inside functions count, and so does every ``Ref("module", ...)``
of the registries (a name resolved later is an import all the same). The model knows nothing of
loaders or runners, the runner nothing of the tasks it drives, serving nothing of training.

``tests/unit/test_structure.py`` holds the package to this list: every import points down or
sideways, every top-level package and module of bertforge is placed here (a new one fails until
it is), and every entry names a module that exists.

An entry names a top-level package or module (``"data"``, ``"config"``) or, where one module
sits in another layer than its package, that module (``"tasks.registry"``): a module belongs
to the layer of the longest entry naming it or a package above it. ``"__init__"`` is the
package's own ``__init__.py`` (its lazy public names). Plain data, no imports: reading it pulls
in nothing.
"""

from __future__ import annotations

LAYERS: tuple[tuple[str, ...], ...] = (
    # the error types; files, valid ranges, refs, the config schema (no torch)
    ("core", "errors"),
    # kernels shared by data and models: token layouts, attention, fused linears, losses
    ("ops",),
    # families: configs, modules, heads, Hugging Face directories, the loader, generation
    ("models",),
    # applied to a built model from outside, by training and serving alike: the speed pass
    # (speed.py), its precision and its device (runtime/)
    ("speed", "runtime"),
    # the tokenizers (they resolve Hub names through models)
    ("tokenization",),
    # corpus -> shards -> batches, the task files' readers; vocabulary training reads the
    # corpus; the sentence-transformers files a directory carries (training writes them,
    # the pipelines read them, export copies them)
    ("data", "tokenization.training", "export.sentence_transformers"),
    # scores of the task files' records, optimizers, shipped recipes, the typed run configs
    # (they name the data's noise and the models' generation settings) and the settings
    # sections of the tasks with options of their own, which the configs compose (torch-free)
    ("metrics", "optim", "recipes", "config", "tasks.settings", "tasks.embedding_settings"),
    # exact search, retrieval evaluation, hard-negative mining
    ("retrieval",),
    # the one runner, its loop and the Task protocol it drives (train/task.py)
    ("train",),
    # the task classes: each a Task of the runner
    ("tasks",),
    # the pipelines; the task records, which name them with the task classes below and build
    # a config's task; and what looks a task up in the records (the pipelines' loader,
    # predict, the interactive prompt, in inference/)
    ("inference", "tasks.registry"),
    # ONNX export and the HTTP server
    ("export", "serve"),
    # one typed config + run() per command (pretrain and finetune: the runner's entry points);
    # the tiny end-to-end run `bertforge demo` makes, which calls those entry points
    ("commands", "demo"),
    # argument parsing; the package's lazy public names
    ("cli", "__init__"),
)


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``module`` (``"bertforge.tasks.squad"`` or
    ``"tasks.squad"``): that of the longest entry naming it or a package above it; None when no
    entry does."""
    name = module.removeprefix("bertforge").removeprefix(".") or "__init__"
    places = {entry: i for i, layer in enumerate(LAYERS) for entry in layer}
    while name:
        if name in places:
            return places[name]
        name = name.rpartition(".")[0]
    return None


__all__ = ["LAYERS", "layer_of"]
