"""Stop signals: SIGTERM and SIGUSR1 (preemption notices from SLURM, Kubernetes, cloud schedulers),
and SIGINT (Ctrl-C).

A command that is stopped must end cleanly at any moment: a message, a defined exit status, and
nothing already written lost. Two modes cover that:

* :func:`raise_on_stop` (start-up, data preparation, shutdown): the signal raises
  :class:`Stopped` in the main thread, so the command unwinds at once through its ``finally``
  blocks and atomic writes (which clean up on any exception). ``Stopped`` derives from
  ``BaseException``, as ``KeyboardInterrupt`` does, so ``except Exception`` clean-up code cannot
  swallow it into a misleading error. SIGINT stays Python's ``KeyboardInterrupt`` there.
* the train loop's ``PreemptionFlag`` (``bertforge.train.loop``): SIGTERM, SIGUSR1 and SIGINT
  only set a flag, and the loop saves a checkpoint at the next step boundary, then the command
  exits 0. SIGINT is no exception: Ctrl-C reaches every process of the terminal's group, and
  torchrun forwards the signal it got to every rank, so a SIGINT repeated within a few seconds
  is no sign of impatience; one repeated later is, and stops the run at once
  (``KeyboardInterrupt``), since a step may hang. It replaces the handlers while the loop runs
  and puts them back afterwards.

Ctrl-C in a terminal, ``timeout`` and batch schedulers signal a whole process group, worker
processes included. Only the main process decides how a command stops: every worker process
bertforge starts (DataLoader workers, ``prepare``'s pool) ignores these signals from its first
instruction, because the parent starts it inside :func:`starting_workers` and the worker calls
:func:`ignore_stop_signals` before unblocking them.

Handlers can only be installed from the main thread; elsewhere (a library caller's worker
thread) these helpers leave the signals alone.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator, Sequence

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)
# Everything that asks a command to stop: what the train loop turns into a checkpoint and an
# exit, and what worker processes ignore.
ALL_STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, *STOP_SIGNALS)
_CAN_BLOCK = hasattr(signal, "pthread_sigmask")  # not on Windows


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


@contextmanager
def starting_workers() -> Iterator[None]:
    """Start worker processes inside this block: the stop signals are blocked in the calling
    thread meanwhile, and a child inherits the mask, so a signal sent to the whole process group
    between a worker's fork and its :func:`ignore_stop_signals` waits instead of killing it.
    What arrived for this process meanwhile is delivered when the block ends."""
    if not _CAN_BLOCK:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ALL_STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_stop_signals(*_: object) -> None:
    """The first thing a worker process does (usable as a DataLoader ``worker_init_fn``): ignore
    SIGINT, SIGTERM and SIGUSR1, then unblock them. A signal that arrived while they were blocked
    is discarded, never acted on: the main process got it too and decides what stops."""
    for sig in ALL_STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if _CAN_BLOCK:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, ALL_STOP_SIGNALS)


__all__ = ["ALL_STOP_SIGNALS", "STOP_SIGNALS", "Stopped", "ignore_stop_signals", "raise_on_stop",
           "starting_workers"]
