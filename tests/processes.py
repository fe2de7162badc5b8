"""What the tests read of a process in /proc (Linux)."""


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for its (new) parent to read it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False
