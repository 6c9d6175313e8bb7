"""Is that process still alive? Answered for processes of this host, without trusting a pid alone.

Node heartbeats, metrics target files and the embedded servers' handle files all name a pid.
A pid outlives nothing: after a SIGKILL it is free, and later another process may get it. A
process is taken for the one recorded only if the pid runs *and* started when it was recorded
to (or, without a recorded start, before the record was written).

"This host" is hostname + boot id + pid namespace: two containers sharing a volume, or a
hostname reused by two machines, never judge each other's pids.
"""

from __future__ import annotations

import functools
import os
import socket

import psutil


@functools.lru_cache(maxsize=1)
def host_id() -> str:
    parts = [socket.gethostname()]
    for path in ("/proc/sys/kernel/random/boot_id",):
        try:
            with open(path) as f:
                parts.append(f.read().strip())
        except OSError:
            pass
    try:
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        pass
    return "/".join(parts)


def started_at(pid: int | None = None) -> float:
    """Unix time the process *pid* (default: this one) started; 0.0 if it does not exist."""
    try:
        return psutil.Process(pid or os.getpid()).create_time()
    except (psutil.Error, ValueError):
        return 0.0


def is_alive(pid: int, started: float | None = None, written_at: float | None = None) -> bool:
    """True if *pid* runs and is the process that was recorded: started at *started* (to the
    hundredth of a second), or, when only the record's time is known, before *written_at*."""
    try:
        process = psutil.Process(int(pid))
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        created = process.create_time()
    except (psutil.Error, ValueError):
        return False
    if started:
        return abs(created - float(started)) < 0.01
    if written_at is not None:
        return created <= written_at + 1.0  # started after the record was written: a reused pid
    return True
