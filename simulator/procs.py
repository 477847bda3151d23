"""Child processes of the agent: free ports, spawning workers that die with
the agent, and stopping them with a grace period."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping

_PR_SET_PDEATHSIG = 1

# Loaded before any fork: dlopen in a forked child of a threaded process can
# deadlock on the loader lock.
_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        _libc = None


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the usual small race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    if _libc is None:
        return None
    prctl = _libc.prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork and prctl; nobody would
        # deliver the death signal then.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def spawn(argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a child that is SIGKILLed if its parent dies (Linux).

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so
    call this from a thread that lives as long as the parent process.
    """
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        env=dict(env) if env is not None else None,
        preexec_fn=_die_with_parent(os.getpid()),
        close_fds=True,
    )


def stop(proc: subprocess.Popen[bytes], grace_s: float) -> int:
    """SIGTERM, then SIGKILL after `grace_s`; returns the exit code."""
    return stop_all([proc], grace_s)[0]


def stop_all(procs: Iterable[subprocess.Popen[bytes]], grace_s: float) -> list[int]:
    """Stops the processes together, so n workers take one grace, not n."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.terminate()
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + max(grace_s, 0.0)
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(max(deadline - time.monotonic(), 0.0)))
        except subprocess.TimeoutExpired:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            codes.append(proc.wait())
    return codes
