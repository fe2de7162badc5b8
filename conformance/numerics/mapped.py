"""Arrays mapped from files (``wire.Reader(mmap=True)``: the weights verify writes for the port's
process, the taps that process writes back) hold no memory until read, and what is read stays
resident while mapped. ``let_go`` gives a mapped array's pages back once read: read again, they
come from the file (the page cache). A full-size case's taps (11.5 GB an image at ViT-g/14 on
518 px) and weights are then never resident in a process at once."""

from __future__ import annotations

import mmap


def let_go(*arrays) -> None:
    """Give back the pages of each array mapped from a file (``np.memmap``); anything else: nothing."""
    for a in arrays:
        mapped = getattr(a, "_mmap", None)  # np.memmap's mapping of its whole file
        if isinstance(mapped, mmap.mmap):
            try:
                mapped.madvise(mmap.MADV_DONTNEED)  # a read-only shared mapping: nothing is lost
            except (AttributeError, OSError, ValueError):
                pass
