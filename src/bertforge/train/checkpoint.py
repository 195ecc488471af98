"""Atomic checkpoints: a Hugging Face model directory plus ``training_state/``.

Layout of ``{output_dir}/checkpoint-{step}/``::

    config.json, model.safetensors, tokenizer files   the model (written by the caller's write_fn)
    training_state/
        meta.json               step, phase, world size, time, library versions (written last)
        optimizer.pt            optimizer.state_dict() (unsharded runs: DDP or one process)
        optimizer_sharded/      the optimizer state of an FSDP run (train.fsdp), one file per rank,
                                written by torch.distributed.checkpoint (.metadata, __{r}_0.distcp)
        scheduler.pt            scheduler.state_dict()
        scaler.pt               GradScaler.state_dict() (only with fp16 loss scaling)
        config.json             the resolved run configuration
        rng_rank{r}.pt          every RNG of rank r (:func:`capture_rng_state`)
        data_rank{r}.json       data-loader position of rank r
    checksums.sha256            SHA-256 of every file above (``sha256sum -c`` reads it)
    COMPLETE                    written last; a directory without it is never resumed from

All ``.pt`` files hold only tensors and plain Python containers, so they load with
``torch.load(weights_only=True)`` (no arbitrary pickle).

Atomicity: everything is written into ``{output_dir}/.tmp-checkpoint-{step}-{random}``; the files
are fsynced, their checksums and then ``COMPLETE`` are written and fsynced, then the directory is
renamed to
``checkpoint-{step}`` (one atomic ``rename``) and ``output_dir`` is fsynced. A crash at any point
leaves either the old set of checkpoints or the new one, plus at most a ``.tmp-*`` directory that
readers ignore and the next save removes. Rank 0 is the only writer: the loop gathers the other
ranks' RNG and data states (:func:`gather_to_rank0`) so one directory holds every rank's position.
The one exception is a sharded optimizer state: every rank writes its shard into the temporary
directory rank 0 created (:meth:`CheckpointManager.start`), before rank 0 publishes it.
Sharded or not, the optimizer state can be read into either layout (:func:`restore_optimizer`),
so a run can switch between DDP and FSDP at a resume.

Integrity: ``checksums.sha256`` and ``meta.json``'s list of files let ``bertforge.train.guards``
verify a checkpoint before anything is loaded from it. A failed write (a full disk) publishes
nothing and raises ``CheckpointWriteError`` naming the file and the newest intact checkpoint.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import pickle
import platform
import random
import re
import shutil
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import numpy as np
import torch

import bertforge
from bertforge.core.jsonfile import read_json
from bertforge.models.hub import unpickler_detail
from bertforge.errors import CheckpointError, RunError
from bertforge.core.io import fsync_dir, fsync_file, write_checksums, write_text_atomic

COMPLETE = "COMPLETE"
TRAINING_STATE = "training_state"
TMP_PREFIX = ".tmp-"
# Numbers in file names are ASCII digits: \d would also match "٣" (and int() read it as 3).
_CKPT_RE = re.compile(r"^checkpoint-([0-9]+)$")
_RNG_RE = re.compile(r"^rng_rank([0-9]+)\.pt$")
_DATA_RE = re.compile(r"^data_rank([0-9]+)\.json$")
SHARDED_OPTIMIZER = "optimizer_sharded"  # directory in training_state/ of an FSDP run
FORMAT_VERSION = 2  # 2: checksums.sha256 and meta["files"]


class CheckpointWriteError(RunError):
    """A checkpoint could not be written (e.g. no space left); nothing was published."""


# --------------------------------------------------------------------------- durability helpers

def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (the files may come from any writer)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fsync_file(os.path.join(dirpath, name))
        fsync_dir(dirpath)


def _files(root: Path) -> list[str]:
    """Every file under ``root``, as '/'-separated paths relative to it."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _remove_dir(path: Path) -> None:
    """Rename to a ``.tmp-`` name first, so a crash half-way through deletion never leaves a
    partial directory that still looks like a checkpoint."""
    doomed = path.with_name(f"{TMP_PREFIX}deleting-{path.name}-{uuid.uuid4().hex[:8]}")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


# --------------------------------------------------------------------------- manager

class CheckpointManager:
    """Writes ``checkpoint-{step}`` directories atomically into ``output_dir`` and keeps the
    newest ``keep`` (``keep <= 0`` keeps all). Only rank 0 should call :meth:`save`;
    :meth:`latest` and :meth:`checkpoints` only read and are safe on every rank."""

    def __init__(self, output_dir: str | os.PathLike, keep: int) -> None:
        self.output_dir = Path(output_dir)
        self.keep = int(keep)

    def start(self, step: int) -> Path:
        """Create (and return) the temporary directory a save of ``step`` will publish, for files
        written by several ranks before :meth:`save` (``tmp=``) finishes it; :meth:`discard` it
        if they fail. Writer only: it removes leftovers of interrupted saves."""
        step = _check_step(step)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.cleanup_incomplete()
        # Not tempfile.mkdtemp: it creates mode 0700, and the published checkpoint should get
        # the user's normal permissions so other tools and users can read it.
        tmp = self.output_dir / f"{TMP_PREFIX}checkpoint-{step}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return tmp

    @staticmethod
    def discard(tmp: Path) -> None:
        """Remove a temporary directory from :meth:`start` that will not be published."""
        shutil.rmtree(tmp, ignore_errors=True)

    def save(self, step: int, write_fn: Callable[[Path], None], tmp: Path | None = None) -> Path:
        """Run ``write_fn(tmp_dir)`` (model files + ``training_state/``), then publish the result
        as ``checkpoint-{step}`` and prune old checkpoints. Returns the checkpoint's path.
        ``tmp``: a directory from :meth:`start` that already holds files of other ranks.

        If ``write_fn`` raises, the temporary directory is removed, nothing is published and the
        exception propagates. Saving a step that already exists replaces it.
        """
        step = _check_step(step)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if tmp is None:
            self.cleanup_incomplete()
            tmp = self.output_dir / f"{TMP_PREFIX}checkpoint-{step}-{uuid.uuid4().hex[:8]}"
        final = self.output_dir / f"checkpoint-{step}"
        old = final.with_name(f"{TMP_PREFIX}replaced-{final.name}-{uuid.uuid4().hex[:8]}")
        try:
            tmp.mkdir(exist_ok=True)
            write_fn(tmp)
            _fsync_tree(tmp)
            write_checksums(tmp, _files(tmp))
            # Written atomically and synced with its directory entry.
            write_text_atomic(tmp / COMPLETE, json.dumps({"step": step}) + "\n")
            # rename() cannot replace a non-empty directory: move an old one aside first, and
            # delete it only once the new one is published.
            if final.exists():
                os.replace(final, old)
            os.replace(tmp, final)
            fsync_dir(self.output_dir)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if old.exists() and not final.exists():
                os.replace(old, final)  # the new one never got published: keep the old one
            if isinstance(exc, OSError):
                raise CheckpointWriteError(self._write_failure(step, tmp, exc)) from exc
            raise
        shutil.rmtree(old, ignore_errors=True)
        self._prune(protect=final)
        return final

    def _write_failure(self, step: int, tmp: Path, exc: OSError) -> str:
        """What failed, in which file of the checkpoint, and what is still intact."""
        where = f"checkpoint-{step}"
        if exc.filename is not None:
            try:
                where += "/" + Path(exc.filename).relative_to(tmp).as_posix()
            except ValueError:  # a file outside the checkpoint (e.g. the directory itself)
                where = str(exc.filename)
        intact = self.latest()
        kept = f"{intact} is intact" if intact else "no earlier checkpoint exists"
        return (f"{exc.strerror or exc} writing {where} in {self.output_dir}; nothing of it was "
                f"published and {kept}. Free space (or fix the file system), then run the same "
                "command to resume")

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints as (step, path), oldest first (numeric order, so 999 < 1000)."""
        if not self.output_dir.is_dir():
            return []
        found = []
        for path in self.output_dir.iterdir():
            if not _CKPT_RE.match(path.name) or not (path / COMPLETE).is_file():
                continue
            found.append((checkpoint_step(path), path))
        return sorted(found, key=lambda sp: (sp[0], sp[1].name))

    def latest(self) -> Optional[Path]:
        """The complete checkpoint with the highest step, or None. ``.tmp-*`` directories and
        checkpoint directories without ``COMPLETE`` are ignored."""
        found = self.checkpoints()
        return found[-1][1] if found else None

    def cleanup_incomplete(self) -> list[Path]:
        """Remove ``.tmp-*`` leftovers of interrupted saves or deletions; returns what it removed.
        Writer only: on another rank this could delete a save in progress."""
        removed = []
        if self.output_dir.is_dir():
            for path in self.output_dir.iterdir():
                if path.name.startswith(TMP_PREFIX) and path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
        return removed

    def _prune(self, protect: Path) -> None:
        """Delete the oldest complete checkpoints beyond ``keep``, never ``protect`` (the one just
        saved, even if an older run left checkpoints with higher steps in the directory)."""
        if self.keep <= 0:
            return
        others = [p for _, p in self.checkpoints() if p != protect]
        for path in others[: max(len(others) - (self.keep - 1), 0)]:
            _remove_dir(path)


def _check_step(step: int) -> int:
    if int(step) != step or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative integer, got {step!r}")
    return int(step)


def checkpoint_step(path: Path) -> int:
    """Step of a checkpoint: ``training_state/meta.json`` if readable, else the directory name."""
    try:
        meta = json.loads((path / TRAINING_STATE / "meta.json").read_text(encoding="utf-8"))
        return int(meta["step"])
    except (OSError, ValueError, KeyError, TypeError):
        match = _CKPT_RE.match(path.name)
        if match is None:
            raise CheckpointError(f"{path}: cannot tell the checkpoint's step (no readable "
                                  "training_state/meta.json and the name is not checkpoint-N)")
        return int(match.group(1))


def required_files(meta: Any) -> list[str]:
    """Files of ``training_state/`` a resume needs, from its ``meta.json`` (None: missing).
    Format 2 lists them; format 1 always wrote a scheduler and one RNG and data file per rank."""
    if not isinstance(meta, dict) or "step" not in meta:
        return ["meta.json"]
    if "files" in meta:
        return ["meta.json", *meta["files"]]
    ranks = range(int(meta.get("world_size", 1)))
    return (["meta.json", "optimizer.pt", "scheduler.pt", "config.json"]
            + [f"rng_rank{r}.pt" for r in ranks] + [f"data_rank{r}.json" for r in ranks])


# --------------------------------------------------------------------------- training state

@dataclass
class TrainingState:
    """What :func:`load_training_state` returns; feed each part to its owner's load_state_dict."""

    step: int
    phase: Any
    optimizer: Optional[dict]            # None when the state is sharded (see sharded_optimizer)
    scheduler: Optional[dict]
    scaler: Optional[dict]
    data_state: dict[int, dict]          # rank -> data-loader state
    rng_states: dict[int, dict]          # rank -> capture_rng_state()
    config: dict
    meta: dict = field(default_factory=dict)
    sharded_optimizer: Optional[Path] = None  # training_state/optimizer_sharded of an FSDP run


def _per_rank(name: str, value: Mapping) -> dict[int, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, int) and k >= 0 for k in value):
        raise TypeError(f"{name} must map rank (int) -> state, e.g. {{0: state}}; got keys "
                        f"{list(value)[:4] if isinstance(value, Mapping) else type(value).__name__}")
    return dict(value)


def save_training_state(
    directory: str | os.PathLike,
    *,
    optimizer: Optional[torch.optim.Optimizer],
    scheduler: Any,
    scaler: Any,
    step: int,
    phase: Any,
    data_state: Mapping[int, dict],
    rng_states: Mapping[int, dict],
    config: Mapping[str, Any],
) -> Path:
    """Write ``directory/training_state/`` (layout in the module docstring) and return its path.

    ``scheduler`` and ``scaler`` may be None (a disabled GradScaler is skipped too), and so may
    ``optimizer`` when every rank has already written its shard with :func:`save_sharded_optimizer`.
    ``data_state`` and ``rng_states`` map each rank to its state; data states must be
    JSON-serializable (JSON turns integer keys into strings). ``config`` is written as JSON with
    non-JSON values (paths, enums) turned into strings.
    """
    data_state = _per_rank("data_state", data_state)
    rng_states = _per_rank("rng_states", rng_states)
    out = Path(directory) / TRAINING_STATE
    out.mkdir(parents=True, exist_ok=True)
    with_scaler = scaler is not None and getattr(scaler, "is_enabled", lambda: True)()
    if optimizer is not None:
        _save_pt(optimizer.state_dict(), out / "optimizer.pt")
    if scheduler is not None:
        _save_pt(scheduler.state_dict(), out / "scheduler.pt")
    if with_scaler:
        _save_pt(scaler.state_dict(), out / "scaler.pt")
    for rank, state in rng_states.items():
        _save_pt(state, out / f"rng_rank{rank}.pt")
    for rank, state in data_state.items():
        try:
            text = json.dumps(state, indent=1)
        except TypeError as exc:
            raise TypeError(f"data_state of rank {rank} is not JSON-serializable: {exc}") from exc
        _write_text(out / f"data_rank{rank}.json", text + "\n")
    _write_text(out / "config.json", json.dumps(dict(config), indent=2, default=str) + "\n")
    now = time.time()
    meta = {
        "format_version": FORMAT_VERSION,
        "step": int(step),
        "phase": phase,
        "world_size": max(len(rng_states), len(data_state)),
        # What a resume must find ('/'-separated below training_state/: the sharded optimizer)
        "files": _files(out),
        "time": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(timespec="seconds"),
        "unix_time": now,
        "versions": {"bertforge": bertforge.__version__, "torch": torch.__version__,
                     "numpy": np.__version__, "python": platform.python_version()},
    }
    _write_text(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    return out


def _write_text(path: Path, text: str) -> None:
    with _naming(path):
        path.write_text(text, encoding="utf-8")


def _save_pt(obj: Any, path: Path) -> None:
    """``torch.save``, but a failed write raises the OSError (e.g. ENOSPC) naming ``path``:
    torch itself reports it as an opaque ``RuntimeError: ... unexpected pos``."""
    errors: list[OSError] = []

    class Recorder:  # the file object torch writes through; keeps the real error
        def write(self, data: bytes) -> int:
            try:
                return f.write(data)
            except OSError as exc:
                errors.append(exc)
                raise

        def flush(self) -> None:
            f.flush()

    with _naming(path), open(path, "wb") as f:
        try:
            torch.save(obj, Recorder())
        except RuntimeError:
            if errors:
                raise errors[0] from None
            raise


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """Give OSErrors raised inside the block ``path`` as their file name (errors of writes to an
    already open file carry none), so a full disk is reported with the file it hit."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def _load_pt(path: Path, map_location: Any) -> Any:
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as exc:
        # torch's own message is long and suggests weights_only=False, which we never do.
        why = (f"refused by torch's weights-only loader: {unpickler_detail(exc)}"
               if isinstance(exc, pickle.UnpicklingError)
               else str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__)
        raise CheckpointError(f"{path}: cannot be read ({why}); the checkpoint is damaged or "
                              "not from bertforge. Resume from an older checkpoint or with "
                              "resume=none.") from exc


def load_json(path: Path) -> Any:
    return read_json(path, error=CheckpointError, hint="the checkpoint is damaged; resume from "
                     "an older checkpoint or with resume=none")


def load_training_state(directory: str | os.PathLike, map_location: Any = "cpu") -> TrainingState:
    """Read what :func:`save_training_state` wrote into ``directory/training_state/``.

    Optimizer, scheduler and scaler tensors go to ``map_location``; RNG states always
    stay on the CPU (torch's generators take CPU byte tensors).
    """
    ts = Path(directory) / TRAINING_STATE
    if not (ts / "meta.json").is_file():
        raise CheckpointError(f"{directory}: no {TRAINING_STATE}/meta.json, so this is not a "
                              "resumable checkpoint; pass a checkpoint-N directory written by "
                              "bertforge, or use init_from to load only its weights")
    meta = load_json(ts / "meta.json")
    missing = [name for name in required_files(meta) if not (ts / name).is_file()]
    if missing:
        raise CheckpointError(f"{ts}: {', '.join(missing)} missing; the checkpoint is damaged. "
                              "Resume from an older checkpoint or with resume=none.")

    def optional_pt(name: str) -> Optional[Any]:
        return _load_pt(ts / name, map_location) if (ts / name).is_file() else None

    rng_states, data_state = {}, {}
    for path in sorted(ts.iterdir()):
        if m := _RNG_RE.match(path.name):
            rng_states[int(m.group(1))] = _load_pt(path, "cpu")
        elif m := _DATA_RE.match(path.name):
            data_state[int(m.group(1))] = load_json(path)
    sharded = ts / SHARDED_OPTIMIZER
    if not (ts / "optimizer.pt").is_file() and not (sharded / ".metadata").is_file():
        raise CheckpointError(f"{ts}: neither optimizer.pt nor {SHARDED_OPTIMIZER}/.metadata "
                              "is there; the checkpoint is damaged. Resume from an older "
                              "checkpoint or with resume=none.")
    return TrainingState(
        step=int(meta["step"]),
        phase=meta.get("phase"),
        optimizer=optional_pt("optimizer.pt"),
        scheduler=optional_pt("scheduler.pt"),
        scaler=optional_pt("scaler.pt"),
        data_state=data_state,
        rng_states=rng_states,
        config=load_json(ts / "config.json"),
        meta=meta,
        sharded_optimizer=None if (ts / "optimizer.pt").is_file() else sharded,
    )


def gather_to_rank0(obj: Any) -> Optional[dict[int, Any]]:
    """``{rank: obj}`` for every rank, on rank 0 (None elsewhere); ``{0: obj}`` without
    torch.distributed. A collective: every rank must call it. Used for RNG and data states."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return {0: obj}
    rank, world = dist.get_rank(), dist.get_world_size()
    gathered: Optional[list[Any]] = [None] * world if rank == 0 else None
    dist.gather_object(obj, gathered, dst=0)
    return dict(enumerate(gathered)) if gathered is not None else None


# --------------------------------------------------------------------------- RNG states

RngState = dict[str, Any]


def capture_rng_state() -> RngState:
    """Every global generator this process draws from: Python's ``random``, NumPy's legacy
    global generator, torch's CPU generator and each CUDA device's. Tensors and plain
    containers only, so it round-trips through ``torch.load(weights_only=True)``; each rank
    captures its own (``rng_rank{r}.pt``)."""
    # NumPy's MT19937 key is a uint32 array of 624 words; stored as int64 so the torch
    # weights-only unpickler accepts it and no value wraps around.
    name, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: RngState = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": str(name),
            "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    return state


def restore_rng_state(state: RngState, *, source: str = "RNG state") -> None:
    """Put every generator back to ``state`` (from :func:`capture_rng_state`).

    CUDA states are restored for ``min(saved, visible)`` devices, so a checkpoint written on a
    GPU machine can still be resumed on the CPU (GPU draws then differ, CPU draws do not).
    ``source`` (e.g. the file path) is named in errors.
    """
    missing = [k for k in ("python", "numpy", "torch") if k not in state]
    if missing:
        raise CheckpointError(f"{source}: RNG state lacks {', '.join(missing)}; the file is not "
                              "from bertforge's capture_rng_state or is damaged. Resume from "
                              "another checkpoint or with resume=none.")
    try:
        version, internal, gauss_next = state["python"]
        random.setstate((version, tuple(internal), gauss_next))
        np_state = state["numpy"]
        np.random.set_state((
            np_state["bit_generator"],
            np.asarray(np_state["key"].numpy(), dtype=np.uint32),
            int(np_state["pos"]),
            int(np_state["has_gauss"]),
            float(np_state["gauss"]),
        ))
        torch.set_rng_state(state["torch"])
        cuda: Optional[list[torch.Tensor]] = state.get("cuda")
        if cuda and torch.cuda.is_available():
            for device, dev_state in enumerate(cuda[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(dev_state, device)
    except (TypeError, ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"{source}: cannot restore the RNG state ({exc}); resume from "
                              "another checkpoint or with resume=none.") from exc
