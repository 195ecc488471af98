"""The CPU's matrix units, which decide the precision inference runs in (``precision=auto``).

bf16 pays on a CPU only where it has bf16 dot-product instructions: Intel's AMX tiles
(Sapphire Rapids and newer) or AVX512-BF16 (Cooper Lake, AMD Zen 4 and 5); elsewhere oneDNN
emulates bf16 with conversions and fp32 arithmetic, slower than fp32 itself. int8 pays with
8-bit dot products: AMX-INT8, AVX512-VNNI (Cascade Lake and newer Xeons, Zen 4 and 5) or
AVX-VNNI (Alder Lake). The flags are read from ``/proc/cpuinfo`` (Linux, x86); elsewhere
from what PyTorch reports, which knows bf16 and AMX but not VNNI.

Tests and users emulate another CPU with :func:`emulated_units` (``BERTFORGE_CPU_UNITS``).

Also the cores a process may use and how replicas share them (:func:`split_cores`,
:func:`pin_process`), for ``bertforge serve --replicas`` and ``bertforge bench inference``
alike, so that a per-core measurement runs as the server runs.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from typing import Sequence

from bertforge.errors import ConfigError

BF16_UNITS = ("amx_bf16", "avx512_bf16")
"""The flags of bf16 matrix units, fastest first."""
INT8_UNITS = ("amx_int8", "avx512_vnni", "avx_vnni")
"""The flags of int8 dot-product units, fastest first."""
EMULATION_VARIABLE = "BERTFORGE_CPU_UNITS"
"""Comma-separated flags that replace the CPU's own (``none``: a CPU without either unit)."""


@dataclass(frozen=True)
class CpuUnits:
    """What ``precision=auto`` reads of the CPU: its name and its instruction-set flags."""

    name: str
    flags: frozenset[str]
    emulated: bool = False

    @property
    def bf16(self) -> str | None:
        """The bf16 unit's flag (``amx_bf16``, ``avx512_bf16``), None without one."""
        return next((flag for flag in BF16_UNITS if flag in self.flags), None)

    @property
    def int8(self) -> str | None:
        """The int8 unit's flag (``amx_int8``, ``avx512_vnni``, ``avx_vnni``), None without."""
        return next((flag for flag in INT8_UNITS if flag in self.flags), None)

    def describe(self) -> str:
        """``AMD EPYC (avx512_bf16, avx512_vnni; PyTorch kernels AVX512)``."""
        import torch  # here: the server's command line reads the cores without torch

        units = [u for u in (self.bf16, self.int8) if u] or ["no bf16 or int8 units"]
        emulated = ", emulated by " + EMULATION_VARIABLE if self.emulated else ""
        return (f"{self.name} ({', '.join(units)}; PyTorch kernels "
                f"{torch.backends.cpu.get_cpu_capability()}{emulated})")


def _proc_cpuinfo() -> tuple[str, frozenset[str]] | None:
    """The first processor's model name and flags from /proc/cpuinfo, None where unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 16)  # the first processor's entry is well within this
    except OSError:
        return None
    name, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
            name = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return (name or platform.processor() or "unknown CPU", flags) if flags else None


def _torch_flags() -> frozenset[str]:
    """The units PyTorch reports (it knows AVX512-BF16 and the AMX tiles, not VNNI)."""
    import torch

    flags = set()
    cpu = getattr(torch, "cpu", None)
    if getattr(cpu, "_is_avx512_bf16_supported", lambda: False)():
        flags.add("avx512_bf16")
    if getattr(cpu, "_is_amx_tile_supported", lambda: False)():
        flags.update(("amx_bf16", "amx_int8"))
    return frozenset(flags)


def emulated_units(spec: str) -> CpuUnits:
    """A CPU with the flags of ``spec`` (``"avx512_vnni"``, ``"amx_bf16,amx_int8"``, or
    ``"none"``), for tests and for trying what ``auto`` would choose on another machine."""
    flags = frozenset(f.strip().lower() for f in spec.split(",") if f.strip()) - {"none"}
    return CpuUnits(name="emulated CPU", flags=flags, emulated=True)


@functools.lru_cache(maxsize=1)
def _machine_units() -> CpuUnits:
    found = _proc_cpuinfo()
    if found is not None:
        return CpuUnits(name=found[0], flags=found[1])
    return CpuUnits(name=platform.processor() or platform.machine() or "unknown CPU",
                    flags=_torch_flags())


def cpu_units() -> CpuUnits:
    """This machine's CPU units, or the emulated ones of ``BERTFORGE_CPU_UNITS`` when set."""
    spec = os.environ.get(EMULATION_VARIABLE)
    return emulated_units(spec) if spec else _machine_units()


# ---------------------------------------------------------------------------- cores
def core_ids() -> list[int]:
    """The ids of the cores this process may run on, ascending: its affinity on Linux (a
    container's or ``taskset``'s share), elsewhere 0 to ``os.cpu_count() - 1``."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return list(range(os.cpu_count() or 1))


def split_cores(ids: Sequence[int], parts: int) -> list[list[int]]:
    """``ids`` cut into ``parts`` disjoint runs of neighbours, as even as can be (the first
    ``len(ids) % parts`` one core longer): the cores of each CPU replica. Neighbouring ids
    usually share a cache (and a socket), so a replica's threads stay close to each other.
    :class:`ConfigError` for more parts than cores: a replica without a core of its own would
    only take turns with another, and slow both."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1 (got {parts})")
    if parts > len(ids):
        raise ConfigError(f"--replicas: {parts} CPU replicas need a core each, but this "
                          f"process may use {len(ids)} ({listed_cores(ids)}); give --replicas "
                          f"{len(ids)} or fewer, or run on more cores")
    size, longer = divmod(len(ids), parts)
    runs, start = [], 0
    for i in range(parts):
        end = start + size + (i < longer)
        runs.append(list(ids[start:end]))
        start = end
    return runs


def pin_process(ids: Sequence[int]) -> bool:
    """Confine this process to the cores ``ids``: every thread it has now (Linux pins one
    thread per call) and, by inheritance, every thread it starts later (torch's and
    onnxruntime's pools). False where the platform cannot pin (``os.sched_setaffinity`` is
    Linux only); nothing is changed then."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the calling thread, which starts the others
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, ids)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return True


def use_cores(ids: Sequence[int] | None, threads: int | None) -> None:
    """This process on the cores ``ids`` (None: not pinned; :func:`pin_process`) with
    ``threads`` torch intra-op threads (None: as they are): how a CPU replica of the server and
    of ``bertforge bench inference`` runs."""
    if ids is not None:
        pin_process(ids)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def listed_cores(ids: Sequence[int]) -> str:
    """``ids`` as runs: ``"cores 0-3, 8"``."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    text = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return f"core{'s' if len(ids) != 1 else ''} {text}"


__all__ = ["BF16_UNITS", "CpuUnits", "EMULATION_VARIABLE", "INT8_UNITS", "core_ids",
           "cpu_units", "emulated_units", "listed_cores", "pin_process", "split_cores",
           "use_cores"]
