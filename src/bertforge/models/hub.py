"""Reading and writing Hugging Face model directories: the base of every bertforge model family.

A family (BERT, BART) subclasses ``PreTrainedModel`` and declares, as class attributes, what the
generic code needs to know about its names: its config class, the base-model prefix of its files
(``bert.``), the prefixes of its body and of its heads, its tied (aliased) keys and the tensors
with one row per vocabulary entry. A model directory is ``config.json`` + ``model.safetensors``
(or ``pytorch_model.bin``, possibly sharded with an ``*.index.json``). Loading is strict about
the body and lenient about heads:

* checkpoint names are normalised first: ``module.``/``_orig_mod.`` wrappers stripped, the
  family's legacy names renamed (BERT: TF-style ``LayerNorm.gamma/beta``), non-persistent buffers
  (``position_ids``) and tied aliases (BERT: ``cls.predictions.decoder.*``) dropped, and the
  base-model prefix added or removed to fit the target class;
* a head of the target class (e.g. pooler, MLM, NSP, QA, classifier) absent from the checkpoint
  keeps its fresh initialisation (logged at INFO: the normal start of fine-tuning);
* weights of a head the target class lacks are dropped (logged at INFO);
* anything else missing, unexpected or of the wrong shape raises ``CheckpointError``.

Vocabulary rows: the model holds ``config.padded_vocab_size`` rows; files hold ``vocab_size`` rows
(what transformers expects). Padded checkpoints (e.g. NVIDIA's multiple of 8) are accepted too.
"""

from __future__ import annotations

import logging
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, TypeVar

import torch
from torch import nn

from bertforge.core.arguments import checked
from bertforge.errors import CheckpointError
from bertforge.models.checks import check_memory, nonfinite_summary
from bertforge.models.hub_names import hub_snapshot, parse_hub_name
from bertforge.core.io import atomic_write
from bertforge.core.jsonfile import read_json
from bertforge.core.paths import check_path_text, named_file

logger = logging.getLogger(__name__)

_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DistributedDataParallel, torch.compile
_MAX_LISTED = 12
_ANOTHER_MODEL = "use another model directory (e.g. an earlier checkpoint)"

ModelT = TypeVar("ModelT", bound="PreTrainedModel")


@dataclass
class LoadReport:
    """What ``load_hf_state_dict`` did besides copying matching weights."""

    initialized: list[str] = field(default_factory=list)
    """Model parameters absent from the checkpoint (whole heads) that kept their initial values."""
    dropped: list[str] = field(default_factory=list)
    """Checkpoint weights of heads this class does not have."""


class PreTrainedModel(nn.Module):
    """Base of every bertforge model class: HF state dicts, from/save_pretrained.

    A family's base class sets the class attributes below; its task classes inherit them.
    """

    config: Any
    config_class: ClassVar[Any]
    """Has ``load(path)``, ``replace(**overrides)``, ``to_json_file(path)`` and ``vocab_size``."""
    checkpoint_prefix: ClassVar[str]
    """Prefix of the base model's weights in the family's files, e.g. "bert"."""
    base_model_prefix: ClassVar[str]
    """Attribute holding the base model in task models; "" for the base model class itself."""
    body_prefixes: ClassVar[tuple[str, ...]]
    """Base-model weight prefixes without ``checkpoint_prefix`` (files of the bare base model)."""
    head_prefixes: ClassVar[tuple[str, ...]]
    """Prefixes of head modules across the family's task classes (with and without the base
    prefix): absent heads start fresh, extra heads are dropped."""
    tied_keys: ClassVar[tuple[str, ...]] = ()
    """Aliases of other parameters: never written, ignored when read."""
    vocab_row_suffixes: ClassVar[tuple[str, ...]] = ()
    """Tensors with one row per vocabulary entry (padded in memory, trimmed in files)."""
    optional_prefixes: ClassVar[tuple[str, ...]] = ()
    """Parts a model's files may lack without it being unfit for its task (they start fresh)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Every model class checks its constructor's arguments (``BertModel(5)``: a TypeError
        # naming config), as the package's other public entry points do.
        if "__init__" in vars(cls):
            cls.__init__ = checked(cls.__init__)  # type: ignore[method-assign]

    def rename_legacy(self, name: str) -> str:
        """The current name of a weight saved under an older naming scheme of the family."""
        return name

    def normal_init_(self, std: float, skip_prefix: str | None = None) -> None:
        """The usual transformer initialisation: Linear/Embedding weights ~ N(0, std), biases 0,
        LayerNorm 1/0; the submodule ``skip_prefix`` (already initialised) is left alone."""
        with torch.no_grad():
            for name, module in self.named_modules():
                if skip_prefix and (name == skip_prefix or name.startswith(skip_prefix + ".")):
                    continue
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    module.weight.normal_(0.0, std)
                    if isinstance(module, nn.Linear) and module.bias is not None:
                        module.bias.zero_()
                elif isinstance(module, nn.LayerNorm):
                    module.weight.fill_(1.0)
                    module.bias.zero_()

    def mismatch_hints(self, names: list[str]) -> list[str]:
        """Family-specific advice for a failed load that involves these weight names."""
        return []

    def transformer_layers(self) -> list[nn.Module]:
        """The repeated transformer blocks, in order (BERT's encoder layers; BART's encoder then
        decoder layers): every entry of an ``nn.ModuleList`` named ``layer`` or ``layers``.
        What is applied from outside (``bertforge.speed``: regional compilation,
        FSDP) works per block."""
        return [block for name, module in self.named_modules()
                if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layer", "layers")
                for block in module]

    # ------------------------------------------------------------------ state dicts
    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Detached state dict in Hugging Face file form: vocab rows trimmed to ``vocab_size`` and
        the tied decoder aliases left out (transformers re-ties them on load)."""
        out: dict[str, torch.Tensor] = {}
        for name, tensor in self.state_dict().items():
            if name in self.tied_keys:
                continue
            tensor = tensor.detach()
            if name.endswith(self.vocab_row_suffixes):
                tensor = tensor[: self.config.vocab_size].clone()  # own storage: safetensors rejects views
            out[name] = tensor
        return out

    def load_hf_state_dict(self, state_dict: Mapping[str, Any], *, source: str = "state dict",
                           ignore_mismatched_heads: bool = False) -> LoadReport:
        """Copy a Hugging Face-named state dict into this model (rules in the module docstring).

        Heads absent from ``state_dict`` keep their current values (their fresh initialisation when
        the model was just built). With ``ignore_mismatched_heads`` a head whose shape differs (e.g. a
        classifier with another label count) is treated as absent. ``source`` names the file in messages.

        Raises:
            CheckpointError: missing body weights, unknown weights, or shape mismatches (all listed).
        """
        tensors = self._normalize_names(state_dict, source)
        own = {k: v for k, v in self.state_dict(keep_vars=True).items() if k not in self.tied_keys}
        if ignore_mismatched_heads:
            for prefix in self.head_prefixes:
                group = [k for k in own if k.startswith(prefix) and k in tensors]
                if any(not self._shape_ok(k, tensors[k].shape, own[k].shape) for k in group):
                    tensors = {k: v for k, v in tensors.items() if not k.startswith(prefix)}
        report = LoadReport()
        missing = [k for k in own if k not in tensors]
        unexpected = [k for k in tensors if k not in own]
        for prefix in self.head_prefixes:
            group = [k for k in own if k.startswith(prefix)]
            if group and all(k in missing for k in group):
                report.initialized += group
                missing = [k for k in missing if k not in group]
        report.dropped = [k for k in unexpected if k.startswith(self.head_prefixes)]
        unexpected = [k for k in unexpected if k not in report.dropped]
        wrong_shape = [
            (k, tuple(tensors[k].shape), tuple(own[k].shape))
            for k in own
            if k in tensors and not self._shape_ok(k, tensors[k].shape, own[k].shape)
        ]
        if missing or unexpected or wrong_shape:
            raise CheckpointError(self._mismatch_message(source, missing, unexpected, wrong_shape, own, tensors))
        wrong_type = next((k for k, t in own.items() if k in tensors and t.is_floating_point()
                           and not tensors[k].is_floating_point()), None)
        if wrong_type is not None:
            raise CheckpointError(f"{source}: weight {wrong_type} is {tensors[wrong_type].dtype}, "
                                  "not a floating-point tensor; the file is damaged or holds no "
                                  "model weights")
        vocab = self.config.vocab_size
        with torch.no_grad():
            for name, target in own.items():
                if name not in tensors:
                    continue
                src = tensors[name]
                if name.endswith(self.vocab_row_suffixes):
                    target[:vocab].copy_(src[:vocab])
                    target[vocab:].zero_()
                else:
                    target.copy_(src)
        if report.initialized:
            logger.info("%s: not in %s, newly initialised: %s", type(self).__name__, source,
                        _short_list(report.initialized))
        if report.dropped:
            logger.info("%s: weights of other heads in %s not used: %s", type(self).__name__, source,
                        _short_list(report.dropped))
        return report

    def _normalize_names(self, state_dict: Mapping[str, Any], source: str) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, tensor in state_dict.items():
            if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
                raise CheckpointError(
                    f"{source}: entry {name!r} is a {type(tensor).__name__}, not a tensor; expected a flat "
                    "mapping of parameter names to tensors"
                )
            name = self.rename_legacy(strip_wrapper_prefixes(name))
            if name.endswith((".position_ids", "embeddings.token_type_ids")):
                continue  # buffers older transformers versions saved; recomputed here
            out[name] = tensor
        out = self.normalize_legacy(out)
        for key in self.tied_keys:
            out.pop(key, None)
        base = self.checkpoint_prefix + "."
        has_prefix = any(k.startswith(base) for k in out)
        if not self.base_model_prefix and has_prefix:
            out = {k[len(base):] if k.startswith(base) else k: v for k, v in out.items()}
        elif self.base_model_prefix and not has_prefix:
            out = {(base + k if k.startswith(self.body_prefixes) else k): v for k, v in out.items()}
        return out

    def normalize_legacy(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Family hook over the whole renamed mapping (e.g. weights stored under an alias)."""
        return tensors

    def _shape_ok(self, name: str, got: torch.Size, want: torch.Size) -> bool:
        if got == want:
            return True
        if not name.endswith(self.vocab_row_suffixes) or got[1:] != want[1:]:
            return False
        rows, vocab = got[0], self.config.vocab_size
        # Real rows, or real rows plus padding to a power-of-two multiple (NVIDIA pads to 8).
        return rows == vocab or any(rows == (vocab + m - 1) // m * m for m in (8, 16, 32, 64, 128))

    def _mismatch_message(self, source: str, missing: list[str], unexpected: list[str],
                          wrong_shape: list[tuple[str, tuple, tuple]], own: Mapping[str, torch.Tensor],
                          tensors: Mapping[str, torch.Tensor]) -> str:
        lines = [f"cannot load {source} into {type(self).__name__}:"]

        def section(title: str, rows: list[str]) -> None:
            if rows:
                lines.append(f"  {title} ({len(rows)}):")
                lines.extend(f"    {r}" for r in rows[:_MAX_LISTED])
                if len(rows) > _MAX_LISTED:
                    lines.append(f"    ... and {len(rows) - _MAX_LISTED} more")

        section("missing from the checkpoint", [f"{k} (model expects {list(own[k].shape)})" for k in missing])
        section("unexpected in the checkpoint", [f"{k} {list(tensors[k].shape)}" for k in unexpected])
        section("wrong shape", [f"{k}: checkpoint {list(g)}, model expects {list(w)}" for k, g, w in wrong_shape])
        names = missing + unexpected + [k for k, _, _ in wrong_shape]
        lines += [f"  {hint}" for hint in self.mismatch_hints(names)]
        lines.append("  Check that config.json (layers, sizes, vocab_size, num_labels) matches the weights; "
                     "pass the right values as overrides, e.g. from_pretrained(path, num_labels=3).")
        if any(k.startswith(self.head_prefixes) for k, _, _ in wrong_shape):
            lines.append("  To replace a head of another size with a fresh one, pass ignore_mismatched_heads=True.")
        return "\n".join(lines)

    # ------------------------------------------------------------------ directories
    @classmethod
    @checked
    def from_pretrained(cls: type[ModelT], path: str | os.PathLike[str], *, ignore_mismatched_heads: bool = False,
                        **config_overrides: Any) -> ModelT:
        """Build from a model directory (config.json + weights) or a Hugging Face Hub name
        (``"google-bert/bert-base-uncased"``, ``"org/name@revision"``: its cached snapshot, else
        downloaded unless ``HF_HUB_OFFLINE``; an existing local path always wins); returns the
        model in eval mode.

        ``config_overrides`` replace config.json fields (e.g. ``hidden_dropout_prob=0.0``,
        ``num_labels=3``); weights must still fit the resulting shapes, except heads when
        ``ignore_mismatched_heads`` (those start fresh, e.g. a 3-label classifier from a 2-label one).
        Commands load through ``bertforge.models.loading``, which picks the class from the files.
        """
        check_path_text(path, f"{cls.__name__}.from_pretrained(path)")
        path = Path(path)
        name = None if path.exists() else parse_hub_name(str(path))
        if name is not None:
            path = hub_snapshot(name, f"from_pretrained({str(path)!r})")
        if not path.is_dir():
            raise CheckpointError(
                f"{path} is not a model directory (expected a folder with config.json and model.safetensors); "
                f"to start from scratch, build the model from {cls.config_class.__name__}.from_preset(name)"
            )
        config = cls.config_class.load(path)
        if config_overrides:
            config = config.replace(**config_overrides)
        check_memory(config, "cpu", str(path / "config.json"))
        model = cls(config)
        model.restore(path, new_heads=ignore_mismatched_heads)
        return model.eval()

    def restore(self, directory: Path, *, new_heads: bool = False,
                nonfinite_remedy: str | None = None) -> LoadReport:
        """Load a model directory's weights (and extras) into this model, verified: every body
        weight present with its shape (``load_hf_state_dict``), floating weights where the model
        has floating parameters, and every value finite. ``new_heads``: heads the files lack or
        hold in another shape start fresh (fine-tuning) instead of being an error.
        ``nonfinite_remedy``: the advice when a value is not finite (default: another model
        directory)."""
        weights, source = read_weights(directory)
        report = self.load_hf_state_dict(weights, source=source,
                                         ignore_mismatched_heads=new_heads)
        problem = nonfinite_summary(self.named_parameters())
        if problem:
            raise CheckpointError(f"{source} holds {problem}; refusing to load it: "
                                  f"{nonfinite_remedy or _ANOTHER_MODEL}")
        self.load_extras(directory)
        return report

    def load_extras(self, directory: Path) -> None:
        """Family hook: read files besides config.json and the weights (e.g. generation
        settings) from a model directory."""

    def save_extras(self, directory: Path) -> None:
        """Family hook: write files besides config.json and the weights into ``directory``."""

    @checked
    def save_pretrained(self, directory: str | os.PathLike[str], tokenizer: Any = None) -> Path:
        """Write config.json and model.safetensors (each atomically) readable by transformers.

        If ``tokenizer`` is given its ``save(directory)`` writes the tokenizer files. Pre-LN models
        are saved too, but config.json marks them as loadable by bertforge only.
        """
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = self.config.replace(architectures=[type(self).__name__])
        tok_lower = getattr(tokenizer, "do_lower_case", None)
        if isinstance(tok_lower, bool) and hasattr(config, "do_lower_case"):
            if config.do_lower_case is None:
                config = config.replace(do_lower_case=tok_lower)
            elif config.do_lower_case != tok_lower:
                raise CheckpointError(
                    f"tokenizer has do_lower_case={tok_lower} but the model config says "
                    f"{config.do_lower_case}: a cased model needs a cased vocabulary and vice versa"
                )
        tensors = {k: v.contiguous().cpu() for k, v in self.hf_state_dict().items()}
        atomic_write(directory / "model.safetensors",
                     lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
        config.to_json_file(directory / "config.json")
        self.save_extras(directory)
        if tokenizer is not None:
            tokenizer.save(directory)
        return directory


def strip_wrapper_prefixes(name: str) -> str:
    """``name`` without the ``module.`` (DDP) / ``_orig_mod.`` (torch.compile) wrappers in front."""
    while name.startswith(_WRAPPER_PREFIXES):
        name = name.split(".", 1)[1]
    return name


_INDEXES = (("model.safetensors.index.json", ".safetensors"),
            ("pytorch_model.bin.index.json", ".bin"))
"""Shard indexes and the one kind of file each may name."""


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], str]:
    """Load all tensors of the model directory ``path``; returns them and the file named in messages."""
    for index_name, suffix in _INDEXES:
        index = path / index_name
        if index.is_file() and not (path / index_name.replace(".index.json", "")).is_file():
            merged: dict[str, torch.Tensor] = {}
            for shard in shard_files(path, index, suffix):
                merged.update(_read_file(shard, suffix))
            return merged, str(index)
    for name, suffix in (("model.safetensors", ".safetensors"), ("pytorch_model.bin", ".bin")):
        if (path / name).is_file():
            return _read_file(path / name, suffix), str(path / name)
    found = ", ".join(sorted(p.name for p in path.iterdir())) or "nothing"
    raise CheckpointError(
        f"no weights in {path}: expected model.safetensors or pytorch_model.bin (found: {found})"
    )


def shard_files(directory: Path, index: Path, suffix: str) -> list[Path]:
    """The shard files a shard index names, in name order: its ``weight_map`` must be an object
    of tensor name -> file name, and each file a ``suffix`` file inside ``directory``
    (``bertforge.core.paths.named_file``), so an index can neither reach outside the model
    directory nor hand a file of another kind to a weights reader."""
    fix = "the index is damaged or not from this model; download or save the model again"
    data = read_json(index, error=CheckpointError, hint=fix, what="shard index")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        what = ("has no 'weight_map' object" if isinstance(data, dict) else
                f"is a JSON {type(data).__name__}, not an object with a 'weight_map'")
        raise CheckpointError(f"{index} {what} (tensor name -> shard file); {fix}")
    bad = next((k for k, v in weight_map.items() if not isinstance(v, str)), None)
    if bad is not None:
        raise CheckpointError(f"{index}: weight_map[{bad!r}] is {weight_map[bad]!r}, not a file "
                              f"name; {fix}")
    return [named_file(directory, name, named_by=f"{index} (weight_map)", suffixes=(suffix,),
                       error=CheckpointError, fix=fix)
            for name in sorted(set(weight_map.values()))]


def _read_file(file: Path, kind: str) -> dict[str, torch.Tensor]:
    """The tensors of ``file``, read as ``kind`` (".safetensors" or ".bin") says: what the index
    or the file's own name promised, never a guess from a suffix spelled another way."""
    if not file.is_file():
        raise CheckpointError(f"weight file {file} is missing (listed in the shard index)")
    if kind == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(file))
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise CheckpointError(f"cannot read {file}: {exc}; the file is damaged or incomplete") from None
    data = load_torch_file(file, remedy=_SAFETENSORS_REMEDY.format(
        file=file, out=file.parent / "model.safetensors"))
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} holds a {type(data).__name__}, expected a state dict (name -> tensor)")
    return data


def load_torch_file(file: Path, *, remedy: str, trust_pickle: bool = False) -> Any:
    """``torch.load`` a file onto the CPU, refusing pickled Python objects unless ``trust_pickle``.

    ``remedy`` tells the user what to do when the file holds more than tensors and plain containers.
    """
    try:
        return torch.load(file, map_location="cpu", weights_only=not trust_pickle)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {file} does not exist") from None
    except pickle.UnpicklingError as exc:
        if trust_pickle:
            raise CheckpointError(f"cannot read {file}: {exc}") from None
        raise CheckpointError(
            f"{file} was refused: it is a pickle, and unpickling can run code stored in it, so "
            f"only plain tensors are read from pickles (torch.load with weights_only=True), and "
            f"this file holds more or is no PyTorch checkpoint (torch: \"{unpickler_detail(exc)}"
            f"\"). {remedy}"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError, ImportError, AttributeError) as exc:
        # ImportError/AttributeError: a trusted pickle refers to a class not installed here.
        raise CheckpointError(f"cannot read {file}: {type(exc).__name__}: {exc}") from None


_SAFETENSORS_REMEDY = (
    "If you trust its origin, convert its tensors to safetensors once and use that file: "
    "python -c \"import torch; from safetensors.torch import save_file; "
    "sd = torch.load('{file}', weights_only=False); "
    "save_file({{k: v.clone().contiguous() for k, v in sd.items() if torch.is_tensor(v)}}, "
    "'{out}', metadata={{'format': 'pt'}})\"; otherwise do not use it")
"""What to do with a pickled weights file that holds more than tensors (a one-line command that
needs nothing but torch and safetensors, for any model family)."""

# Paragraphs of torch's weights_only error that are advice, not the reason.
_TORCH_ADVICE = ("Weights only load failed", "In PyTorch 2.6", "Re-running `torch.load`",
                 "Check the documentation", "(1)", "(2)", "This file can still be loaded")


def unpickler_detail(exc: Exception) -> str:
    """Why torch's weights_only unpickler refused a file: the reason line of its long message
    (its wording differs between a blocked function and a class not on its allow-list)."""
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:
        tail = text.split(marker, 1)[1].strip()
        return tail.split(". Please use", 1)[0].split("\n", 1)[0].strip().rstrip(".")
    reasons = [line.strip() for line in text.splitlines()
               if line.strip() and not line.strip().startswith(_TORCH_ADVICE)]
    if reasons:
        return reasons[0].rstrip(".")
    return text.splitlines()[0].rstrip(".") if text else type(exc).__name__


def _short_list(names: list[str]) -> str:
    head = ", ".join(names[:_MAX_LISTED])
    return head + (f", ... ({len(names)} in all)" if len(names) > _MAX_LISTED else "")
