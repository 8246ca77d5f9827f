"""Peak resident memory of a command and every process it starts (Linux /proc).

:func:`run_tree` runs a command and polls its process tree: each process's peak resident
set is its ``VmHWM`` (the kernel's high-water mark, read every poll until the process
exits: a peak in the last poll interval of a process's life can be missed), and the tree's
total is the largest sum of the processes' current ``VmRSS`` seen at one poll. ``wait4``'s
``ru_maxrss`` of the root (``max_rss``: the largest of the root and every descendant it
reaped, exact) bounds every process's peak from above. Dask worker processes are labelled
by their command line (``worker``: a LocalCluster's spawned worker, ``nanny``, ...).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TreeRun", "run_tree"]

GIB = 1024**3
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class TreeRun:
    """What :func:`run_tree` measured (bytes)."""

    seconds: float
    returncode: int
    max_rss: int
    cpu: float
    """user + system seconds of the root and every descendant it reaped"""
    root: int
    peaks: dict[int, tuple[str, int]] = field(default_factory=dict)
    cpus: dict[int, float] = field(default_factory=dict)
    """user + system seconds of each process at its last poll"""
    total_peak: int = 0
    stdout: str = ""

    @property
    def root_peak(self) -> int:
        """The root process's peak resident set (polled VmHWM)."""
        return self.peaks.get(self.root, ("", 0))[1]

    def workers(self) -> list[int]:
        """Peak resident set of each Dask worker process (bytes), in pid order."""
        return [v for pid, (lab, v) in sorted(self.peaks.items()) if lab == "worker"]

    def worker_cpus(self) -> list[float]:
        """CPU seconds of each Dask worker process (at its last poll), in pid order."""
        return [
            self.cpus.get(pid, 0.0)
            for pid, (lab, _) in sorted(self.peaks.items())
            if lab == "worker"
        ]

    def others(self) -> list[tuple[str, int]]:
        """Every other descendant (nannies, trackers, ...)."""
        return [v for pid, v in sorted(self.peaks.items()) if pid != self.root and v[0] != "worker"]


def _kib(status: str, key: str) -> int:
    for line in status.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _label(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"
    if "resource_tracker" in raw:
        return "tracker"
    if "spawn_main" in raw:
        return "worker"
    return raw.strip()[:60]


def _descendants(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            parent[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = [root], [root]
    while frontier:
        nxt = [p for p, pp in parent.items() if pp in frontier]
        out += nxt
        frontier = nxt
    return out


def run_tree(
    cmd: Sequence[str], *, interval: float = 0.25, env: dict[str, str] | None = None
) -> TreeRun:
    """Run ``cmd`` (stdout captured, stderr passed through) and measure its tree."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, text=True, env=env)
    peaks: dict[int, tuple[str, int]] = {}
    cpus: dict[int, float] = {}
    total = 0
    stop = threading.Event()

    def poll() -> None:
        nonlocal total
        while not stop.is_set():
            now = 0
            for pid in _descendants(proc.pid):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                hwm, rss = _kib(status, "VmHWM"), _kib(status, "VmRSS")
                try:
                    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    cpus[pid] = (int(f[11]) + int(f[12])) / TICKS
                except (OSError, IndexError, ValueError):
                    pass
                now += rss
                label = peaks.get(pid, (_label(pid), 0))[0]
                peaks[pid] = (label, max(hwm, peaks.get(pid, ("", 0))[1]))
            total = max(total, now)
            stop.wait(interval)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    stop.set()
    th.join()
    return TreeRun(
        seconds=time.perf_counter() - t0,
        returncode=os.waitstatus_to_exitcode(status),
        max_rss=usage.ru_maxrss * 1024,
        cpu=usage.ru_utime + usage.ru_stime,
        root=proc.pid,
        peaks=peaks,
        cpus=cpus,
        total_peak=total,
        stdout=out,
    )
