"""python -m conformance bench: forward throughput of every port against timm, side by side.

For each model and batch size, timm's ``VisionTransformer`` (random init) and each port on
the same weights (converted through the canonical format), fast path (the framework's fused
attention, plus mx.compile for MLX and jax.jit for JAX) and explicit path (the attention
written out), each timed with warm-up then repeats in this process, one after another; the
median is reported, with images/s, the ratio to timm, the achieved GFLOP/s against the
float32 matmul peak measured in the same run, and the growth of the process's peak resident
memory while the entry is built and run (Linux; allocators that keep freed memory make it
a lower bound).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from impls import get_config, load_factory

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
    per_block = 2 * N * D * 3 * D + 2 * 2 * H * N * N * config.head_dim + 2 * N * D * D + 2 * 2 * N * D * config.mlp_hidden_dim
    total = 2 * config.num_patches * D * config.in_chans * ph * pw + config.depth * per_block + 2 * D * config.num_classes
    return float(batch * total)


def matmul_peak(n: int = 2048, repeats: int = 5) -> dict[str, float]:
    """float32 GFLOP/s of an n x n matmul in torch and NumPy, median of ``repeats``."""
    import torch

    out = {}
    a, b = np.random.default_rng(0).normal(size=(2, n, n)).astype(np.float32)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    for name, fn in (("torch", lambda: ta @ tb), ("numpy", lambda: a @ b)):
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


def run(models=MODELS, batches=(1, 8), warmup: int = 2, repeats: int = 5, entries=ENTRIES) -> dict:
    import timm
    import torch

    from conformance.references import timm_state
    from impls.mlx_blas import sgemm_provider

    torch.set_grad_enabled(False)
    peak = matmul_peak()
    rows = []
    for name in models:
        config = get_config(name)
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False).eval()
        state = timm_state(model)
        for batch in batches:
            x = np.random.default_rng(batch).normal(size=(batch, 3, 224, 224)).astype(np.float32)
            flops = vit_flops(config, batch)
            timm_seconds = None
            for label, port, options in entries:
                base = _reset_peak_rss()
                if port is None:
                    fn = lambda images: model(torch.from_numpy(images))  # noqa: E731
                else:
                    fn = load_factory(port)(config, state, taps=False, **options)
                seconds, peak_mb = time_forward(fn, x, warmup, repeats, base)
                timm_seconds = seconds if port is None else timm_seconds
                rows.append({"model": name, "batch": batch, "port": label, "seconds": seconds,
                             "images_per_s": batch / seconds, "ratio_to_timm": timm_seconds / seconds,
                             "gflops": flops / seconds / 1e9, "peak_fraction": flops / seconds / 1e9 / max(peak.values()),
                             "peak_mb": peak_mb})
                print(_format_row(rows[-1]), flush=True)
    return {"machine": {"platform": platform.platform(), "processor": _cpu_name(), "cores": os.cpu_count(),
                        "matmul_peak_gflops": peak, "mlx_sgemm": sgemm_provider()},
            "warmup": warmup, "repeats": repeats, "rows": rows}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _format_row(r: dict) -> str:
    return (f"{r['model']:22} b{r['batch']:<2} {r['port']:15} {r['images_per_s']:8.2f} img/s  "
            f"{r['ratio_to_timm']:5.2f}x timm  {r['gflops']:6.1f} GFLOP/s ({100 * r['peak_fraction']:4.0f}% of peak)  "
            f"peak {r['peak_mb']:7.1f} MB")


def main(args) -> int:
    models = args.models or list(MODELS)
    result = run(models, tuple(args.batches), args.warmup, args.repeats)
    m = result["machine"]
    print(f"\nmachine: {m['processor']}, {m['cores']} cores; float32 matmul peak (2048^2): "
          + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in m["matmul_peak_gflops"].items())
          + f"; MLX cblas_sgemm from {m['mlx_sgemm']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0
