"""The heap of verify's processes (glibc): freed memory kept for reuse in the command line's
process, and given back to the OS where a case or an answer is done."""

from __future__ import annotations


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8


def keep_freed_memory() -> None:
    """Keep freed memory in the heap for reuse, for a process that is verify's alone (the command
    line: the settings last as long as the process). A full-size case's stages are allocated anew
    at every step, and every page given back to the OS (an array above glibc's mmap threshold, a
    trimmed heap top, a thread's own arena) is faulted in again: ViT-B spent a sixth of its CPU
    time in the kernel. One arena for every thread, large blocks from the heap, no trim;
    ``return_freed_memory`` gives the pages back after each full-size case (docs/performance.md)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_ARENA_MAX, 1)
        libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30)
        libc.mallopt(_M_TRIM_THRESHOLD, 1 << 32)
        libc.mallopt(_M_TOP_PAD, 256 << 20)
    except (OSError, AttributeError):
        pass


def return_freed_memory() -> None:
    """Give the heap's free pages back: in verify after a full-size case (glibc keeps what the error
    model's threads freed in their arenas, which would add up over the cases) and once a drawn
    weight set is replaced by its mapped file (``Isolated``: before the port's forward); in the
    port's process after each answer (a port's taps freed in the heap stay resident otherwise:
    11.4 GB through a ViT-g/14 comparison); elsewhere nothing."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
