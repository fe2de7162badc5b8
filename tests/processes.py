"""What the tests read of a process in /proc (Linux)."""


def _stat(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields after the command's name (state, parent, ...)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for its (new) parent to read it."""
    try:
        return _stat(pid)[0] != b"Z"
    except OSError:
        return False


def parent(pid: int) -> int:
    return int(_stat(pid)[1])
