"""python -m conformance bench: forward throughput of every port against timm, side by side.

For each model and batch size, timm's ``VisionTransformer`` (random init) and each port on
the same weights (converted through the canonical format), fast path (the framework's fused
attention, plus mx.compile for MLX and jax.jit for JAX) and explicit path (the attention
written out). Each entry runs in a fresh process, one after another in the same run: warm-up,
then repeats, the median reported with images/s, the ratio to timm, the achieved GFLOP/s
against the float32 matmul peak measured in the same run, and the growth of peak resident
memory from just before the port is built (its weights, workspace and compiled code; Linux).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from conformance.references import timm_state
from impls import get_config, load_factory
from impls.mlx_blas import sgemm_provider, use_openblas
import sys
import subprocess

MODELS = ("vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224")
ENTRIES = (
    ("timm", None, {}),
    ("torch fast", "torch", dict(fused_attn=True)),
    ("torch explicit", "torch", {}),
    ("mlx fast", "mlx", dict(fused_attn=True, compiled=True)),
    ("mlx explicit", "mlx", {}),
    ("jax fast", "jax", dict(fused_attn=True)),
    ("jax explicit", "jax", {}),
)


def vit_flops(config, batch: int) -> float:
    """Multiply-adds x 2 of one forward (matmuls and the patch conv; elementwise work left out)."""
    N, D, H = config.num_tokens, config.embed_dim, config.num_heads
    ph, pw = config.patch_size
    per_block = (
        2 * N * D * 3 * D + 2 * 2 * H * N * N * config.head_dim + 2 * N * D * D + 2 * 2 * N * D * config.mlp_hidden_dim
    )
    total = (
        2 * config.num_patches * D * config.in_chans * ph * pw + config.depth * per_block + 2 * D * config.num_classes
    )
    return float(batch * total)


def matmul_peak(n: int = 2048, repeats: int = 5) -> dict[str, float]:
    """float32 GFLOP/s of an n x n matmul in torch and NumPy, median of ``repeats``."""
    import torch

    out = {}
    a, b = np.random.default_rng(0).normal(size=(2, n, n)).astype(np.float32)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    for name, fn in (("torch", lambda: ta @ tb), ("numpy", lambda: a @ b)):
        for _ in range(3):  # thread pools and allocations come up on the first calls
            fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[name] = 2 * n**3 / statistics.median(times) / 1e9
    return out


def _reset_peak_rss() -> int:
    """Reset the kernel's peak-RSS mark (Linux) and return the current RSS in kB."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_kb("VmRSS")
    except OSError:
        return 0


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def time_forward(fn, x, warmup: int, repeats: int, base: int) -> tuple[float, float]:
    """(median seconds, peak RSS in MB above ``base``, the RSS before the entry was built)."""
    for _ in range(warmup):
        fn(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    peak = (_status_kb("VmHWM") - base) / 1024 if base else float("nan")
    return statistics.median(times), peak


def measure_entry(name: str, batch: int, label: str, warmup: int, repeats: int) -> dict:
    """One entry, in this process: build timm's model and the port, time the forward, and the
    growth of peak resident memory from just before the port is built."""
    import timm
    import torch

    torch.set_grad_enabled(False)
    config = get_config(name)
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    state = timm_state(model)
    x = np.random.default_rng(batch).normal(size=(batch, 3, 224, 224)).astype(np.float32)
    _, port, options = next(e for e in ENTRIES if e[0] == label)
    base = _reset_peak_rss()
    if port is None:

        def fn(images):  # timm as its users run it for inference, as the torch port runs
            with torch.inference_mode():
                return model(torch.from_numpy(images))
    else:
        del model  # only the port's copy of the weights counts
        fn = load_factory(port)(config, state, taps=False, **options)
    seconds, peak_mb = time_forward(fn, x, warmup, repeats, base)
    return {"seconds": seconds, "peak_mb": peak_mb}


def run(models=MODELS, batches=(1, 8), warmup: int = 2, repeats: int = 5, entries=ENTRIES) -> dict:
    """Every entry in a fresh process, one after another, so each peak-memory figure is its own."""

    use_openblas()
    peak = matmul_peak()
    rows = []
    for name in models:
        config = get_config(name)
        for batch in batches:
            flops = vit_flops(config, batch)
            timm_seconds = None
            for label, port, _ in entries:
                out = subprocess.run(
                    [sys.executable, "-m", "conformance.bench", name, str(batch), label, str(warmup), str(repeats)],
                    capture_output=True,
                    text=True,
                )
                if out.returncode:
                    raise RuntimeError(f"{name} b{batch} {label} failed:\n{out.stderr[-2000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                timm_seconds = r["seconds"] if port is None else timm_seconds
                rows.append(
                    {
                        "model": name,
                        "batch": batch,
                        "port": label,
                        "seconds": r["seconds"],
                        "images_per_s": batch / r["seconds"],
                        "ratio_to_timm": timm_seconds / r["seconds"],
                        "gflops": flops / r["seconds"] / 1e9,
                        "peak_fraction": flops / r["seconds"] / 1e9 / max(peak.values()),
                        "peak_mb": r["peak_mb"],
                    }
                )
                print(_format_row(rows[-1]), flush=True)
    return {
        "machine": {
            "platform": platform.platform(),
            "processor": cpu_name(),
            "cores": os.cpu_count(),
            "matmul_peak_gflops": peak,
            "mlx_sgemm": sgemm_provider(),
        },
        "warmup": warmup,
        "repeats": repeats,
        "rows": rows,
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _format_row(r: dict) -> str:
    return (
        f"{r['model']:22} b{r['batch']:<2} {r['port']:15} {r['images_per_s']:8.2f} img/s  "
        f"{r['ratio_to_timm']:5.2f}x timm  {r['gflops']:6.1f} GFLOP/s ({100 * r['peak_fraction']:4.0f}% of peak)  "
        f"peak {r['peak_mb']:7.1f} MB"
    )


if __name__ == "__main__":  # one entry, for run(): python -m conformance.bench MODEL BATCH LABEL WARMUP REPEATS
    import sys

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    model_name, batch_size, entry, n_warmup, n_repeats = sys.argv[1:6]
    print(json.dumps(measure_entry(model_name, int(batch_size), entry, int(n_warmup), int(n_repeats))))
