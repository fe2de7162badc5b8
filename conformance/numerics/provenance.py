"""What produced a measurement: package versions, the BLAS each framework calls, the CPU.

The calibration (calibration.json) and the benchmark record this beside their figures, so
every threshold can be traced to the software and machine it was measured on;
``differences`` tells what changed since.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
import re

import numpy as np

PACKAGES = ("numpy", "scipy", "torch", "mlx", "jax", "jaxlib", "flax", "timm", "transformers", "hypothesis")
# The packages whose arithmetic the calibrated constants depend on.
NUMERIC_PACKAGES = ("numpy", "scipy", "torch", "mlx", "jax", "jaxlib", "flax")
CPU_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "neon", "asimd")


def versions() -> dict[str, str | None]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu() -> dict:
    info = {
        "machine": platform.machine(),
        "system": platform.system(),
        "cores": os.cpu_count(),
        "model": platform.processor() or None,
        "flags": [],
    }
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not info["flags"]:
            info["model"] = value.strip()
        if key in ("flags", "Features"):
            present = set(value.split())
            info["flags"] = [f for f in CPU_FLAGS if f in present]
            break
    return info


def blas() -> dict[str, str | None]:
    """The BLAS behind each framework's float32 matmul, as each reports it."""
    out: dict[str, str | None] = {}
    try:
        deps = np.show_config(mode="dicts").get("Build Dependencies", {})
        out["numpy"] = " ".join(str(deps.get("blas", {}).get(k, "")) for k in ("name", "version")).strip() or None
    except Exception:  # noqa: BLE001 - older numpy: no dict mode
        out["numpy"] = None
    try:
        import torch

        cfg = torch.__config__.show()
        found = re.search(r"BLAS_INFO=(\w+)", cfg)
        capability = re.search(r"CPU capability usage: (\w+)", cfg)
        out["torch"] = f"{found.group(1) if found else 'unknown'} ({capability.group(1) if capability else '?'})"
    except ImportError:
        out["torch"] = None
    try:
        from impls.mlx_blas import sgemm_provider, use_openblas

        use_openblas()
        import mlx.core as mx

        mx.eval(mx.ones((2, 2)) @ mx.ones((2, 2)))
        out["mlx"] = sgemm_provider() or "built-in"
    except ImportError:
        out["mlx"] = None
    out["jax"] = "XLA:CPU (Eigen)"  # XLA's CPU backend links its own GEMMs
    return out


def collect() -> dict:
    return {"versions": versions(), "blas": blas(), "cpu": cpu(), "platform": platform.platform()}


def differences(recorded: dict | None, running: dict | None = None, packages=NUMERIC_PACKAGES) -> list[str]:
    """One line per numeric package, BLAS or CPU whose version differs from the recorded one."""
    if not recorded:
        return ["no provenance recorded"]
    running = collect() if running is None else running
    lines = []
    for name in ("python", *packages):
        a, b = recorded.get("versions", {}).get(name), running.get("versions", {}).get(name)
        if a != b:
            lines.append(f"{name}: calibrated with {a}, running {b}")
    for name, value in recorded.get("blas", {}).items():
        if running.get("blas", {}).get(name) != value:
            lines.append(f"{name} BLAS: calibrated with {value}, running {running.get('blas', {}).get(name)}")
    rc, nc = recorded.get("cpu", {}), running.get("cpu", {})
    if (rc.get("machine"), rc.get("flags")) != (nc.get("machine"), nc.get("flags")):
        lines.append(
            f"CPU: calibrated on {rc.get('model')} {rc.get('flags')}, running on {nc.get('model')} {nc.get('flags')}"
        )
    return lines
