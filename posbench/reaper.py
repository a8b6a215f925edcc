"""A watchdog for the processes a posbench command starts: when the command dies outright
(kill -9, the OOM killer), it ends the processes the command left: a local Ray runtime, which
Ray's own agents otherwise keep alive for about a minute, or the compiler building a C++ kernel.
Run as `python posbench/reaper.py DRIVER_PID`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import suppress

import psutil

#: How often the watchdog looks at the driver and its descendants (s).
WATCH_SECONDS = 0.5


def start_reaper(driver_pid: int) -> subprocess.Popen:
    """Start the watchdog for `driver_pid` in its own session, so Ctrl-C at a terminal, meant
    for the driver, does not reach it."""
    return subprocess.Popen(
        # by its path, not -m: importing the posbench package (and torch) takes seconds, and
        # a driver killed in those seconds would leave its processes unseen
        [sys.executable, os.path.abspath(__file__), str(driver_pid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def reap_after(driver_pid: int) -> None:
    """Wait for `driver_pid` to end, then kill the descendants it had at the last look (each
    checked by its start time, so a reused pid is never hit)."""
    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:
        return
    me = os.getpid()
    seen: dict[int, float] = {}
    while driver.is_running() and driver.status() != psutil.STATUS_ZOMBIE:
        try:
            seen = {p.pid: p.create_time() for p in driver.children(recursive=True) if p.pid != me}
        except psutil.Error:  # the driver ended while we looked
            break
        time.sleep(WATCH_SECONDS)
    for pid, started in seen.items():
        with suppress(psutil.Error):  # gone already
            process = psutil.Process(pid)
            if process.create_time() == started:
                process.kill()


if __name__ == "__main__":
    reap_after(int(sys.argv[1]))
