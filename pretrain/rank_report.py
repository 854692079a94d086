"""What each rank reports about itself, for the events of a many-rank job: when it reached each start-up phase (the
slowest rank sets the whole job's time to its first step, so the event names it), its peak host memory (one rank's
leak or spike is invisible in rank 0's numbers), and, when `logging.comm_timing` is on, the seconds its step spent in
DeepSpeed's collectives. Every rank builds its part; the trainer gathers them (one `all_gather_object`) and rank 0
writes the summaries below.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

# start-up phases in the order a rank passes them (startup.py marks each)
PHASES = ("process", "imported", "data_ready", "rendezvous", "model", "converted", "engine", "loaded")


def process_start_time() -> float:
    """When this process started (Unix time), from /proc; the current time where /proc has no answer."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, after the parenthesised command name
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


class StartupClock:
    """This rank's time at each start-up phase (Unix seconds, comparable across the nodes of a job)."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {"process": process_start_time(), "imported": time.time()}

    def mark(self, phase: str) -> None:
        assert phase in PHASES, phase
        self.marks[phase] = time.time()


def summarize_startup(marks: list[dict[str, float]], hosts: list[str]) -> dict[str, Any]:
    """Per phase, the seconds from the first rank's process start until the LAST rank reached it, that rank, and the
    longest any rank took from its previous phase to this one: {"rendezvous": {"s": 41.2, "rank": 17, "host":
    "node3", "took_s": 12.0}, ...} (phases some rank skipped are left out)."""
    t0 = min(m["process"] for m in marks)
    out: dict[str, Any] = {}
    previous: str | None = None
    for phase in PHASES:
        if not all(phase in m for m in marks):
            continue
        last = max(range(len(marks)), key=lambda r: marks[r][phase])
        took = max(m[phase] - m[previous] for m in marks) if previous else 0.0
        out[phase] = {
            "s": round(marks[last][phase] - t0, 3),
            "rank": last,
            "host": hosts[last],
            "took_s": round(took, 3),
        }
        previous = phase
    return out


def gather_startup(group: Any, clock: StartupClock) -> tuple[list[str], dict[str, Any]]:
    """(every rank's host name, `summarize_startup` of every rank's marks): one collective, every rank calls it."""
    gathered = group.all_gather((socket.gethostname(), clock.marks))
    hosts = [host for host, _ in gathered]
    return hosts, summarize_startup([marks for _, marks in gathered], hosts)


def host_memory_mb() -> dict[str, float]:
    """This process's peak and current resident memory and its private anonymous part, in MB (from /proc)."""
    fields = {"VmHWM": "peak_rss", "VmRSS": "rss", "RssAnon": "anon"}
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in fields:
                    out[fields[key]] = round(int(value.split()[0]) / 1024, 1)  # kB
    except (OSError, ValueError):
        pass
    return out


def summarize_memory(per_rank: list[dict[str, float]], hosts: list[str]) -> dict[str, Any]:
    """Peak resident memory over the ranks: max (and which rank, host), mean, min; {} where /proc was unreadable."""
    peaks = [m.get("peak_rss") for m in per_rank]
    if any(p is None for p in peaks):
        return {}
    top = max(range(len(peaks)), key=peaks.__getitem__)
    return {
        "peak_rss_mb_max": peaks[top],
        "peak_rss_mb_mean": round(sum(peaks) / len(peaks), 1),
        "peak_rss_mb_min": min(peaks),
        "rank": top,
        "host": hosts[top],
    }


class CommTimer:
    """Seconds this rank spent in DeepSpeed's collectives (gradient reduce-scatter / all-reduce, parameter
    all-gather) since the last `take()`, through DeepSpeed's own comms profiler: with `comms_logger` enabled every
    `deepspeed.comm` op is made blocking and timed. Off (returns None) unless `logging.comm_timing` is set, since
    blocking ops cost a GPU its compute/communication overlap."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def take(self) -> float | None:
        if not self.enabled:
            return None
        from deepspeed.comm import comm

        # the timers accumulate every op's interval until reset; the logger's own per-op records are cumulative
        # sums of them (never reset), so they are dropped here rather than read
        seconds = sum(t.elapsed(reset=True) for t in comm.timers.timers.values()) / 1000.0
        comm.comms_logger.comms_dict.clear()
        return seconds
