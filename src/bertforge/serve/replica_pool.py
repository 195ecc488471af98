"""The replica processes of a replicated server (:mod:`bertforge.serve.replicas`) and what keeps
them answering.

:class:`ReplicaPool` starts one process per replica (``spawn``: safe with CUDA), sends each
batch to the free replica that has waited longest, and watches them:

* **A deadline per batch.** A replica that does not answer in time (deadlocked, a hung device,
  stopped) is killed with SIGKILL, which works on a stopped process too; the requests of its
  batch fail at once with :class:`ReplicaDied` (a JSON 503 with Retry-After), never a hang. The
  deadline is ``--replica-timeout`` when set, else derived from the batches answered so far
  (:meth:`ReplicaPool.deadline`).
* **Restarts with back-off.** A replica that died (killed, out of memory, a crash in native
  code) or missed its deadline is started again after 1 s, then 2, 4 ... (at most a minute), at
  most ``--replica-restarts`` times over the server's life; after that it stays down. Its
  requests are not retried elsewhere, so a request that crashes a replica cannot crash the
  others in turn.
* **Seen at once.** One watcher thread waits on the processes of idle and loading replicas and
  on the pipes of loading ones: a death is noticed without any request, a restarted replica
  takes batches as soon as it says it is ready. The thread that sent a batch watches its own
  replica (pipe and process together).
* **Routing around it.** Only ready replicas (idle or busy) get batches; while none is ready a
  batch fails at once with the 503 rather than wait for a restart. ``/health`` says
  ``degraded`` and lists the replicas that are not ready; ``/metrics`` counts restarts and
  missed deadlines per replica.

Replicas ignore SIGINT, SIGTERM and SIGUSR1 (started with them blocked, so a signal to the whole
process group never reaches one): the main process decides when to stop, drains its queue
(which needs them), then :meth:`ReplicaPool.close` tells each to exit and kills stragglers.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Sequence

from bertforge.core.signals import starting_workers
from bertforge.errors import UserError
from bertforge.serve.batching import BatchLost
from bertforge.runtime.cpu import core_ids, listed_cores, split_cores
from bertforge.serve.limits import SHUTTING_DOWN
from bertforge.serve.replica_worker import ReplicaSpec, replica_main

log = logging.getLogger("bertforge.serve")

STOP_GRACE_S = 10.0  # how long close() waits for replicas to exit before killing them
BACKOFF_S = 1.0  # the first restart's delay; it doubles with each restart of a replica
BACKOFF_CAP_S = 60.0
FIRST_DEADLINE_S = 600.0
"""The automatic deadline of a batch until one has been measured: a first batch may compile
kernels or page the weights in, and nothing is known yet of the model's speed."""
MIN_DEADLINE_S = 60.0
LOAD_DEADLINE_S = 600.0  # a restarted replica still loading after this is killed (a failure)
DEADLINE_FACTOR = 10.0
READY = ("idle", "busy")


class ReplicaDied(BatchLost):
    """The replica running a batch ended or was killed before answering it (or none is ready).
    The message is a whole sentence that says what to do; ``retry_after``: seconds until
    retrying here may succeed."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a replica, attached as its ``__cause__`` so the
    server log shows where in the replica it happened."""

    def __init__(self, text: str) -> None:
        super().__init__(f"\n--- in the replica ---\n{text.rstrip()}")


class _Replica:
    """The main process's handle on one replica, with its counts for /health and /metrics. Its
    process and pipe change when it is restarted; the counts are the replica's, over all."""

    def __init__(self, index: int, device: str, cores: list[int] | None = None,
                 threads: int | None = None) -> None:
        self.index, self.device = index, device
        self.cores, self.threads = cores, threads  # CPU replicas: pinned to, intra-op threads
        self.process: Any = None
        self.conn: Connection | None = None
        # starting -> idle <-> busy; once its process ended: restarting (waiting out its
        # back-off, then starting again) or dead (not restarted again)
        self.state = "starting"
        self.exit_code: int | None = None
        self.failure: str | None = None  # why its last process ended
        self.batches = self.items = self.errors = self.timeouts = self.restarts = 0
        self.busy_seconds = 0.0
        self.turn = -1  # when it last took a batch (a count of batches sent)
        self.answered_here = 0  # batches its current process answered (the first warms up)
        # busy: when its batch is overdue; restarting: when it starts again; starting again:
        # when it must have loaded
        self.due = 0.0
        self.deadline = 0.0  # busy: the seconds its batch was given
        self.why: str | None = None  # why its process ended, where the pool knows better

    def row(self) -> dict[str, Any]:
        return {"replica": self.index, "device": self.device, "cores": self.cores,
                "threads": self.threads,
                "pid": self.process.pid if self.process is not None else None,
                "state": self.state, "exit_code": self.exit_code, "failure": self.failure,
                "batches": self.batches, "items": self.items,
                "busy_seconds": round(self.busy_seconds, 6), "errors": self.errors,
                "timeouts": self.timeouts, "restarts": self.restarts}


def _plan_cores(devices: Sequence[str], threads: int) -> list[_Replica]:
    """One handle per replica, the CPU ones with their share of this process's cores and
    their threads (``threads``, else one per core of their share); said once in the log,
    with what cannot be done here (pinning off Linux, more threads than cores)."""
    on_cpu = [i for i, device in enumerate(devices) if device == "cpu"]
    shares = dict(zip(on_cpu, split_cores(core_ids(), len(on_cpu)))) if on_cpu else {}
    pinned = hasattr(os, "sched_setaffinity")
    replicas = [_Replica(i, device, shares[i] if pinned else None,
                         threads or len(shares[i])) if i in shares else _Replica(i, device)
                for i, device in enumerate(devices)]
    if len(on_cpu) > 1 and pinned:
        log.info("%d CPU replicas, each pinned to cores of its own: %s", len(on_cpu),
                 "; ".join(f"replica {r.index} {listed_cores(r.cores)}, {r.threads} "
                           f"thread{'s' if r.threads != 1 else ''}"
                           for r in replicas if r.cores is not None))
    elif len(on_cpu) > 1:
        log.warning("this platform cannot pin a process to cores (os.sched_setaffinity is "
                    "Linux only): the %d CPU replicas are not pinned and share every core "
                    "(threads: %s)", len(on_cpu),
                    ", ".join(str(replicas[i].threads) for i in on_cpu))
    crowded = [i for i in on_cpu if threads > len(shares[i])]
    if crowded and len(on_cpu) > 1:
        log.warning("--model-threads %d is more than the %d core(s) of replica %d: its threads "
                    "take turns on them; leave it at 0 for one thread per core", threads,
                    len(shares[crowded[0]]), crowded[0])
    return replicas


class ReplicaPool:
    """Replica processes of one model; :meth:`run` sends a batch to the free one that has waited
    longest, so the work spreads over all of them even under light load (thread-safe: the
    batcher calls it from one thread per replica). ``timeout``: seconds per batch (0:
    automatic); ``restarts``: how often each replica may be restarted; ``backoff``: the first
    restart's delay; ``threads``: each CPU replica's intra-op threads (``--model-threads``;
    0: as many as it has cores). CPU replicas split this process's cores
    (:func:`~bertforge.runtime.cpu.split_cores`; a ConfigError when there are fewer cores
    than CPU replicas) and each pins itself to its own; GPU replicas are not pinned."""

    def __init__(self, spec: ReplicaSpec, devices: Sequence[str], *, timeout: float = 0.0,
                 restarts: int = 5, backoff: float = BACKOFF_S, threads: int = 0) -> None:
        self.spec, self.devices = spec, list(devices)
        self.timeout, self.max_restarts, self.backoff = timeout, restarts, backoff
        self.descriptions: dict[str, dict] = {}  # describe() of replica 0's pipelines
        self._replicas = _plan_cores(self.devices, threads)
        self._changed = threading.Condition()
        self._closed = False
        self._turns = 0
        self._rates: dict[str, float] = {}  # per kind: the slowest seconds per token measured
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._watcher: threading.Thread | None = None
        self._context = multiprocessing.get_context("spawn")

    @property
    def size(self) -> int:
        return len(self.devices)

    # ------------------------------------------------------------------------ starting

    def start(self) -> None:
        """Start every replica (they load in parallel) and wait until each is ready; a replica
        that fails to load is a one-line ``UserError`` (call :meth:`close` in any case)."""
        for replica in self._replicas:
            self._spawn(replica)
        for replica in self._replicas:
            message = self._ready_message(replica)
            if message is None or message[0] != "ready":
                replica.process.join(5.0)
                why = message[1] if message is not None else (
                    f"its process ended (exit code {replica.process.exitcode}) while loading the "
                    "model; the log above may say why")
                raise UserError(f"replica {replica.index} ({replica.device}) did not start: {why}")
            if replica.index == 0:
                self.descriptions = message[1]
            replica.state = "idle"
        self._watcher = threading.Thread(target=self._watch, name="bertforge-replica-watcher",
                                         daemon=True)
        self._watcher.start()

    def _spawn(self, replica: _Replica) -> None:
        mine, theirs = self._context.Pipe()
        process = self._context.Process(
            target=replica_main, name=f"bertforge-replica-{replica.index}", daemon=True,
            args=(self.spec, replica.device, replica.cores, replica.threads, theirs, os.getpid()))
        with starting_workers():  # a group signal while it starts must not kill it
            process.start()
        theirs.close()
        replica.process, replica.conn, replica.state = process, mine, "starting"
        replica.answered_here, replica.why = 0, None
        replica.due = time.monotonic() + LOAD_DEADLINE_S

    @staticmethod
    def _ready_message(replica: _Replica) -> tuple | None:
        """The first message of a loading replica (blocks), None when its process ended."""
        assert replica.conn is not None
        if replica.conn in wait([replica.conn, replica.process.sentinel]):
            try:
                return replica.conn.recv()
            except (EOFError, OSError):
                pass
        return None

    # ------------------------------------------------------------------------ running batches

    def deadline(self, kind: str, tokens: int) -> float:
        """Seconds a replica has to answer a batch of ``tokens`` tokens (their costs) of the
        ``kind`` pipeline: ``--replica-timeout`` when set; else 10 x the most seconds per token
        any batch of that kind took (each replica process's first batch, a warm-up, left out)
        x ``tokens``, at least 60 s; 600 s while no batch has been measured."""
        if self.timeout > 0:
            return self.timeout
        with self._changed:
            rate = self._rates.get(kind)
        if rate is None:
            return FIRST_DEADLINE_S
        return max(MIN_DEADLINE_S, DEADLINE_FACTOR * rate * max(tokens, 1))

    def run(self, kind: str, requests: Sequence[Any], tokens: int = 0) -> list[Any]:
        """The results of ``requests`` (``tokens``: their summed costs) run as one batch by the
        ``kind`` pipeline ("task" or "embeddings") of a free replica; blocks while all ready
        ones are busy. Raises what the pipeline raised, or :class:`ReplicaDied`."""
        replica = self._acquire(self.deadline(kind, tokens))
        started = time.monotonic()
        answered = False
        try:
            reply = self._exchange(replica, (kind, list(requests)))
            if reply[0] == "ok":
                answered = True
                return reply[1]
            raise reply[1] from (RemoteTraceback(reply[2]) if reply[2] else None)
        finally:
            self._release(replica, kind, len(requests), tokens, time.monotonic() - started,
                          answered)

    def _acquire(self, seconds: float) -> _Replica:
        with self._changed:
            while True:
                if self._closed:
                    raise ReplicaDied(SHUTTING_DOWN)
                self._reap()
                idle = [r for r in self._replicas if r.state == "idle"]
                if idle:
                    replica = min(idle, key=lambda r: r.turn)  # ties: the lowest index
                    replica.state, replica.turn = "busy", self._turns
                    replica.deadline, replica.due = seconds, time.monotonic() + seconds
                    self._turns += 1
                    self._wake()  # the watcher times the new deadline
                    return replica
                if not any(r.state == "busy" for r in self._replicas):
                    raise self._none_ready()
                self._changed.wait()

    def _none_ready(self) -> ReplicaDied:
        """The error of a batch no replica can take (called holding the lock)."""
        coming = [r for r in self._replicas if r.state in ("starting", "restarting")]
        if not coming:
            return ReplicaDied("every replica of this server has stopped and none will be "
                               "restarted (see /health); restart the server", BACKOFF_CAP_S)
        # The first that may be back: a loading one any moment, a waiting one at its restart.
        wait_s = max(1.0, min(r.due - time.monotonic() if r.state == "restarting" else 1.0
                              for r in coming))
        return ReplicaDied(f"no replica of this server is ready: {len(coming)} of {self.size} "
                           "are restarting (see /health); retry the request in a few seconds",
                           wait_s)

    def _exchange(self, replica: _Replica, message: tuple) -> tuple:
        """Send a batch and wait for its answer, or for the replica's end (a death, or the
        watcher's kill at the deadline)."""
        assert replica.conn is not None
        try:
            replica.conn.send(message)  # the watcher kills a replica too stopped to read it
            ready = wait([replica.conn, replica.process.sentinel],
                         max(0.0, replica.due - time.monotonic()))
            if replica.conn in ready:
                return replica.conn.recv()
            if not ready:
                with self._changed:
                    self._expire(replica)
        except (EOFError, OSError):
            pass
        replica.process.join(5.0)
        if replica.process.is_alive():  # its pipe broke but it runs on: never two of it
            replica.process.kill()
            replica.process.join(5.0)
        with self._changed:
            self._bury(replica)
            ready = sum(r.state in READY for r in self._replicas)
            fate = "is being restarted" if replica.state == "restarting" else "stays down"
            retry = 1.0 if ready else max(1.0, replica.due - time.monotonic())
        what = (f"did not answer this request within {replica.deadline:g} s (--replica-timeout) "
                "and was killed" if replica.why else
                f"stopped (exit code {replica.exit_code}) while running this request")
        return ("error", ReplicaDied(
            f"replica {replica.index} ({replica.device}) {what}; it {fate} and {ready} of "
            f"{self.size} replicas are ready: retry the request", retry), "")

    def _release(self, replica: _Replica, kind: str, items: int, tokens: int, seconds: float,
                 answered: bool) -> None:
        with self._changed:
            replica.busy_seconds += seconds
            if answered:
                replica.batches += 1
                replica.items += items
                if replica.answered_here and tokens > 0:
                    self._rates[kind] = max(self._rates.get(kind, 0.0), seconds / tokens)
                replica.answered_here += 1
            else:
                replica.errors += 1
            if replica.state == "busy":
                replica.state = "idle"
            self._changed.notify_all()

    # ------------------------------------------------------------------------ watching

    def _bury(self, replica: _Replica) -> None:
        """A replica whose process ended: restarting after its back-off, or dead once its
        restarts are spent (called holding the lock)."""
        if replica.state in ("restarting", "dead"):
            return
        replica.exit_code = replica.process.exitcode
        replica.failure = replica.why or f"stopped (exit code {replica.exit_code})"
        if replica.conn is not None:
            replica.conn.close()
        if self._closed:  # stopped by close(): nothing to say or restart
            replica.state = "dead"
        elif replica.restarts < self.max_restarts:
            delay = min(self.backoff * 2 ** replica.restarts, BACKOFF_CAP_S)
            replica.state, replica.due = "restarting", time.monotonic() + delay
            log.error("replica %d (%s, pid %s) %s; restarting it in %g s (restart %d of %d)",
                      replica.index, replica.device, replica.process.pid, replica.failure, delay,
                      replica.restarts + 1, self.max_restarts)
        else:
            replica.state = "dead"
            log.error("replica %d (%s, pid %s) %s; it is not restarted again "
                      "(--replica-restarts %d)", replica.index, replica.device,
                      replica.process.pid, replica.failure, self.max_restarts)
        self._changed.notify_all()
        self._wake()

    def _reap(self) -> None:
        """Bury idle replicas whose process ended (a busy one's caller buries it, the watcher a
        loading one, when its pipe ends); called holding the lock."""
        for replica in self._replicas:
            if replica.state == "idle" and replica.process.exitcode is not None:
                self._bury(replica)

    def _wake(self) -> None:
        """Interrupt the watcher's wait: a deadline or a restart time changed (called holding
        the lock, so never after :meth:`close` closed the pipe)."""
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b".")
            except BlockingIOError:  # full: the watcher has wake-ups enough to read
                pass

    def _watch(self) -> None:
        """The watcher thread: kill overdue replicas, bury ended ones, restart them when due,
        and hear the restarted ones say they are ready. It must outlive any surprise: without
        it no deadline is kept and no replica comes back."""
        while not self._closed:
            try:
                self._watch_once()
            except Exception:
                log.exception("the replica watcher failed; it carries on")
                time.sleep(1.0)  # the same failure again must not spin a core

    def _watch_once(self) -> None:
        with self._changed:
            if self._closed:
                return
            now = time.monotonic()
            self._kill_overdue(now)
            self._reap()
            self._restart_due(now)
            loading = [r for r in self._replicas if r.state == "starting"]
            handles: list[Any] = [r.conn for r in loading]  # ends with the process too
            handles += [r.process.sentinel for r in self._replicas if r.state == "idle"]
            due = [r.due for r in self._replicas if r.state in ("busy", "restarting")
                   or r in loading]
        timeout = max(0.0, min(due) - now) if due else None
        ready = wait([*handles, self._wake_r], timeout)
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)
        for replica in loading:
            if replica.conn in ready:
                self._hear(replica)

    def _kill_overdue(self, now: float) -> None:
        for replica in self._replicas:
            if replica.state in ("busy", "starting") and replica.due <= now:
                self._expire(replica)

    def _expire(self, replica: _Replica) -> None:
        """Kill a replica past its deadline (SIGKILL ends a stopped process too); whoever waits
        on it sees the process end and buries it (called holding the lock)."""
        if replica.why or replica.state not in ("busy", "starting"):
            return
        if replica.state == "busy":
            replica.timeouts += 1
            replica.why = (f"did not answer within {replica.deadline:g} s "
                               "(--replica-timeout) and was killed")
        else:
            replica.why = (f"did not load the model within {LOAD_DEADLINE_S:g} s and was "
                               "killed")
        replica.process.kill()

    def _restart_due(self, now: float) -> None:
        for replica in self._replicas:
            if replica.state == "restarting" and replica.due <= now:
                replica.restarts += 1
                log.warning("starting replica %d (%s) again (restart %d of %d)", replica.index,
                            replica.device, replica.restarts, self.max_restarts)
                try:
                    self._spawn(replica)
                except OSError as exc:  # no process to be had (limits, memory): try later
                    log.error("replica %d could not be started: %s", replica.index, exc)
                    replica.state = "starting"  # so that _bury counts it as a failed restart
                    replica.why = f"could not be started ({exc})"
                    replica.conn = None
                    self._bury(replica)

    def _hear(self, replica: _Replica) -> None:
        """The first message of a restarted replica: ready, or why it could not load."""
        assert replica.conn is not None
        try:
            message = replica.conn.recv()
        except (EOFError, OSError):
            message = None
        with self._changed:
            if self._closed or replica.state != "starting":
                return
            if message is not None and message[0] == "ready":
                replica.state = "idle"
                log.warning("replica %d (%s) is ready again (pid %s)", replica.index,
                            replica.device, replica.process.pid)
                self._changed.notify_all()
                return
            if message is not None and replica.why is None:
                replica.why = f"could not load the model again: {message[1]}"
            replica.process.kill()
            replica.process.join(5.0)
            self._bury(replica)

    # ------------------------------------------------------------------------ reporting, closing

    def snapshot(self) -> list[dict[str, Any]]:
        """One row per replica: replica (its index), device, pid, state (starting, idle, busy,
        restarting, dead), exit code and failure of its last process, and the batches, items,
        busy seconds, errors, missed deadlines (timeouts) and restarts so far."""
        with self._changed:
            self._reap()
            return [replica.row() for replica in self._replicas]

    def health(self) -> dict[str, Any]:
        """What ``/health`` adds: ``status`` ok (every replica ready), degraded (some are not:
        ``unready_replicas`` lists them) or down (none is), ``ready``, ``ready_replicas`` and
        the replicas' rows."""
        rows = self.snapshot()
        unready = [row["replica"] for row in rows if row["state"] not in READY]
        ready = len(rows) - len(unready)
        status = "ok" if not unready else "degraded" if ready else "down"
        return {"status": status, "ready": ready > 0, "ready_replicas": ready,
                "unready_replicas": unready, "replicas": rows}

    def close(self, grace: float = STOP_GRACE_S) -> None:
        """Tell every replica to exit, wait up to ``grace`` seconds, then kill what is left."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            self._wake()
        if self._watcher is not None:
            self._watcher.join(5.0)
        started = [r for r in self._replicas if r.process is not None]
        for replica in started:
            if replica.state == "busy":  # a batch the drain gave up on: it may never end
                replica.process.kill()
                continue
            try:
                if replica.conn is not None:
                    replica.conn.send(None)
            except OSError:  # closed: its process already ended
                pass
        deadline = time.monotonic() + grace
        for replica in started:
            replica.process.join(max(0.0, deadline - time.monotonic()))
        for replica in started:
            if replica.process.is_alive():
                log.warning("replica %d (pid %s) did not exit within %.0f s; killing it",
                            replica.index, replica.process.pid, grace)
                replica.process.kill()
                replica.process.join(5.0)
            if replica.conn is not None:
                replica.conn.close()
        with self._changed:
            if self._wake_w >= 0:  # once: a descriptor number closed twice may be another's
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_r = self._wake_w = -1


__all__ = ["ReplicaDied", "ReplicaPool", "RemoteTraceback"]
