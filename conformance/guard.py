"""What a port run in verify's own process can do to it, undone (the ``--in-process`` path and
the plugin's property tests; the command line runs a port in a process of its own instead)."""

from __future__ import annotations

import contextlib
import os

import numpy as np


@contextlib.contextmanager
def process_state():
    """What a port can do to the interpreter it shares with verify, undone when it returns:
    NumPy's floating-point error handling, functions of ``numpy`` and ``numpy.linalg``
    replaced, the working directory. (In a process of its own nothing reaches verify at all.)"""
    modules = (np, np.linalg)
    saved = [dict(vars(m)) for m in modules]
    errors, cwd = np.geterr(), os.getcwd()
    try:
        yield
    finally:
        np.seterr(**errors)
        for module, before in zip(modules, saved):
            now = vars(module)
            for key, value in before.items():
                if now.get(key) is not value:
                    setattr(module, key, value)
        with contextlib.suppress(OSError):
            if os.getcwd() != cwd:
                os.chdir(cwd)
