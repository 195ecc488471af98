"""Stop signals: SIGTERM and SIGUSR1 (preemption notices from SLURM, Kubernetes, cloud schedulers).

A command that is stopped must end cleanly at any moment: a message, a defined exit status, and
nothing already written lost. Two modes cover that:

* :func:`raise_on_stop` (start-up, data preparation, shutdown): the signal raises
  :class:`Stopped` in the main thread, so the command unwinds at once through its ``finally``
  blocks and atomic writes (which clean up on any exception). ``Stopped`` derives from
  ``BaseException``, as ``KeyboardInterrupt`` does, so ``except Exception`` clean-up code cannot
  swallow it into a misleading error.
* the train loop's ``PreemptionFlag`` (``bertforge.train.loop``): the signal only sets a flag,
  and the loop saves a checkpoint at the next step boundary. It replaces the raising handler
  while the loop runs and puts it back afterwards.

SIGINT stays Python's ``KeyboardInterrupt``. Handlers can only be installed from the main thread;
elsewhere (a library caller's worker thread) these helpers leave the signals alone.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator, Sequence

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)


class Stopped(BaseException):
    """A stop signal arrived; raised in the main thread by :func:`raise_on_stop`."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"stopped by {self.signal_name}")

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + signal number, the shell's convention for "ended by this signal"."""
        return 128 + self.signum


def _raise_stopped(signum: int, frame: object) -> None:  # noqa: ARG001 (signal API)
    raise Stopped(signum)


@contextmanager
def raise_on_stop(signals: Sequence[signal.Signals] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block, each of ``signals`` raises :class:`Stopped` in the main thread; the
    previous handlers are restored on exit. A no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = ["STOP_SIGNALS", "Stopped", "raise_on_stop"]
