"""Capture and restore every global random number generator a training process draws from.

Python's ``random``, NumPy's legacy global generator, torch's CPU generator and (when present) each
CUDA device's generator. The captured state holds only tensors and plain Python containers, so it
round-trips through ``torch.save`` / ``torch.load(weights_only=True)``. Each rank captures its own
state; the checkpoint keeps one file per rank (``rng_rank{r}.pt``).
"""

from __future__ import annotations

import random
from typing import Any, Optional

import numpy as np
import torch

from bertforge.errors import CheckpointError

RngState = dict[str, Any]


def capture_rng_state() -> RngState:
    """Snapshot of all global generators of this process (see module docstring)."""
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
