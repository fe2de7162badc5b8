"""Run MLX on Linux with an optimised BLAS.

The ``mlx[cpu]`` wheel for Linux links the reference BLAS (``mlx_cpu.libs/libblas-*.so``),
whose sgemm reaches a few GFLOP/s. MLX calls plain ``cblas_sgemm``; an OpenBLAS loaded into
the process's global symbol scope *before* ``mlx.core`` is imported provides that symbol
first, and MLX binds to it. OpenBLAS comes from the Debian registry
(``apt-get install libopenblas0-pthread``); PyPI's ``scipy-openblas`` wheels prefix their
symbols (``scipy_cblas_sgemm``) and cannot stand in.

On by default where such a library is found; ``VIT_CONFORMANCE_MLX_BLAS=0`` turns it off,
``VIT_CONFORMANCE_MLX_BLAS=/path/libopenblas.so.0`` names the library.

Debian's OpenBLAS 0.3.21 does not recognise recent Xeons and falls back to its "Prescott"
(SSE3) kernels: 31 GFLOP/s for a 2048^2 sgemm on this project's machine, 202 with the
"SkylakeX" kernels. Unless OPENBLAS_CORETYPE is already set, the kernels are chosen from the
CPU's flags (avx512f: SkylakeX, avx2: Haswell) for this one library load; the variable is
restored afterwards, so other BLAS libraries and child processes are not affected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
)
_loaded: str | None = None


def find_openblas() -> str | None:
    choice = os.environ.get("VIT_CONFORMANCE_MLX_BLAS", "")
    if choice == "0":
        return None
    if choice:
        return choice
    for path in CANDIDATES:
        if os.path.exists(path):
            return path
    return ctypes.util.find_library("openblas")


def use_openblas() -> str | None:
    """Load OpenBLAS globally if MLX is not imported yet; return its path, or None."""
    global _loaded
    if _loaded or not sys.platform.startswith("linux"):
        return _loaded
    path = find_openblas()
    if path is None or "mlx.core" in sys.modules:
        return None
    coretype = None if "OPENBLAS_CORETYPE" in os.environ else _coretype()
    if coretype:
        os.environ["OPENBLAS_CORETYPE"] = coretype  # read once, when the library initialises
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    finally:
        if coretype:
            del os.environ["OPENBLAS_CORETYPE"]
    _loaded = path
    return path


def _coretype() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return None
    if "avx512f" in flags:
        return "SkylakeX"
    if "avx2" in flags:
        return "Haswell"
    return None


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def sgemm_provider() -> str | None:
    """The library whose cblas_sgemm the process's global scope, and so MLX, resolves to."""
    libc = ctypes.CDLL(None)
    try:
        fn = libc.cblas_sgemm
    except AttributeError:
        return None
    info = _DlInfo()
    dladdr = libc.dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    if dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) == 0:
        return None
    return info.dli_fname.decode() if info.dli_fname else None
