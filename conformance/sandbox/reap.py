"""No process a port started outlives the check that started it.

The port's process leads a session of its own (so the terminal's Ctrl-C is verify's alone), and
verify kills that session's process group when it is done with the port. A process the port
started in a session of its own (``setsid``, ``start_new_session=True``, a daemon's double fork)
escapes the group, so each port process carries a token in its environment, inherited by
everything it starts: on Linux, ``kill_marked`` finds every process with the token (or in the
port's session or group) through /proc and kills it. A process that both clears its
environment and leaves the session cannot be told from any other process of the user's, and
is not found; nor is anything on a system without /proc (macOS: the group alone is killed).
"""

from __future__ import annotations

import os
import signal
import time
import uuid

TOKEN_ENV = "VIT_CONFORMANCE_RUN"


def new_token() -> str:
    return uuid.uuid4().hex


def _stat(pid: str) -> tuple[int, int] | None:
    """(process group, session) of a process, from /proc/PID/stat (its name may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[2]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def _marked(pid: str, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def marked(token: str, leader: int | None = None) -> list[int]:
    """The processes carrying ``token``, or in the group or session ``leader`` led; never this
    process."""
    if not os.path.isdir("/proc"):
        return []
    needle = f"{TOKEN_ENV}={token}".encode()
    me = os.getpid()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        ids = _stat(pid) if leader is not None else None
        if (ids is not None and leader in ids) or _marked(pid, needle):
            found.append(int(pid))
    return found


def kill_marked(token: str, leader: int | None = None, rounds: int = 20) -> int:
    """SIGKILL every process ``marked`` finds, again until none is left (one may fork while it is
    being killed); how many were killed."""
    killed: set[int] = set()
    for _ in range(rounds):
        pids = [p for p in marked(token, leader) if _alive(p)]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    return len(killed)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent to read its status."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False
