"""``python -m conformance bench --verify``: what verifying costs, per config, side by side.

For each config: ``python -m conformance verify PORT --preset NAME --set ...`` as a user runs
it (the port in its own process), its wall time and the peak of verify's and the port's
memory together (their proportional set sizes, sampled from /proc every 250 ms), and the time of one float64 NumPy
oracle forward over the same cases, measured in the same run: the ratio of the two is the
figure to hold (an absolute time is the machine's). Written to docs/data/bench_verify.json;
``python -m conformance docs`` renders docs/performance.md's table from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from conformance.bench import cpu_name
from conformance.verify.budget import MEMORY_ENV, case_batch, forward_flops, sizes
from conformance.verify.cases import FULL_SIZE, iter_plan, row_plan, verify_plan
from impls import get_config
import platform

# (label, preset, --set overrides, memory to plan for or None): widths, depths and token counts,
# three of each or more; three sizes planned for a machine too small for cases of two images
# (one-image cases, as ViT-g/14 runs on 24 GB: the fit's batch term is measured, not assumed)
ONE_IMAGE = 1.0e9  # bytes: below every full-size config's estimate at a batch of 2
CONFIGS = [
    ("ViT-Ti/16", "vit_tiny_patch16_224", {}, None),
    ("ViT-S/16", "vit_small_patch16_224", {}, None),
    ("ViT-B/16", "vit_base_patch16_224", {}, None),
    ("ViT-L/16", "vit_large_patch16_224", {}, None),
    ("ViT-L/14 at 336 (CLIP)", "vit_large_patch14_clip_336", {}, None),
    ("ViT-B/16, depth 3", "vit_base_patch16_224", {"depth": 3}, None),
    ("ViT-B/16, depth 6", "vit_base_patch16_224", {"depth": 6}, None),
    ("ViT-S/16 at 112 (50 tokens)", "vit_small_patch16_224", {"img_size": 112}, None),
    ("ViT-S/16 at 160 (101 tokens)", "vit_small_patch16_224", {"img_size": 160}, None),
    ("ViT-B/16, one-image cases", "vit_base_patch16_224", {}, ONE_IMAGE),
    ("ViT-L/16, one-image cases", "vit_large_patch16_224", {}, ONE_IMAGE),
    ("ViT-L/14 at 336 (CLIP), one-image cases", "vit_large_patch14_clip_336", {}, ONE_IMAGE),
]


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _rss(pid: int) -> int:
    """The process tree's proportional set size: pages shared between its processes (the weights
    the port's process maps from verify's files) counted once."""
    total = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration, ValueError):
            pass
    return total


def run_verify(port: str, preset: str, settings: dict, memory: float | None = None) -> dict:
    """verify as a subprocess: wall seconds, the peak of its process tree's memory, its verdict
    (``memory``: the bytes it plans for, ``$VIT_CONFORMANCE_MEMORY``)."""

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        # --force: the benchmark measures what the estimate is fitted to, it is not refused by it
        cmd = [
            sys.executable,
            "-m",
            "conformance",
            "verify",
            port,
            "--preset",
            preset,
            "--json",
            str(report),
            "--force",
        ]
        cmd += [f"--set={k}={json.dumps(v)}" for k, v in settings.items()]
        start = time.perf_counter()
        env = {**os.environ, **({MEMORY_ENV: str(int(memory))} if memory else {})}
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        peak, done = [0], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], _rss(proc.pid))
                done.wait(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, err = proc.communicate()
        wall = time.perf_counter() - start
        done.set()
        sampler.join()
        verdict = json.loads(report.read_text())["conformant"] if report.exists() else None
        return {
            "seconds": wall,
            "peak_gb": peak[0] / 1e9,
            "exit": proc.returncode,
            "conformant": verdict,
            "error": err.decode(errors="replace")[-300:] if proc.returncode not in (0, 1) else "",
        }


def oracle_seconds(preset: str, settings: dict, batch: int | None = None) -> float:
    """One float64 NumPy oracle forward over verify's default cases (their weights and images made
    outside the timing)."""
    from impls import numpy_vit

    config = get_config(preset).replace(**settings)
    total = 0.0
    for case in iter_plan(verify_plan(config, batch=batch)):
        forward = numpy_vit.make(config, case.state)
        start = time.perf_counter()
        forward(case.images)
        total += time.perf_counter() - start
    return total


def run(configs=CONFIGS, port: str = "torch") -> dict:

    rows = []
    for label, preset, settings, memory in configs:
        config = get_config(preset).replace(**settings)
        batch = case_batch(config, memory)
        measured = run_verify(port, preset, settings, memory)
        oracle = oracle_seconds(preset, settings, batch)
        rows.append(
            {
                "label": label,
                "preset": preset,
                "settings": settings,
                "port": port,
                "batch": batch,
                "memory_planned": memory,
                **measured,
                "oracle_seconds": oracle,
                "ratio": measured["seconds"] / oracle,
                "tokens": config.num_tokens,
                "depth": config.depth,
                "width": config.embed_dim,
            }
        )
        print(
            f"{label}: {measured['seconds']:.1f} s, {measured['peak_gb']:.2f} GB, oracle {oracle:.1f} s, "
            f"ratio {rows[-1]['ratio']:.1f}",
            file=sys.stderr,
            flush=True,
        )
    machine = {"platform": platform.platform(), "processor": cpu_name(), "cores": os.cpu_count()}
    return {"machine": machine, "date": time.strftime("%Y-%m-%d"), "rows": rows}


def fit(rows) -> dict[str, float]:
    """``conformance.verify.budget``'s constants from benchmark rows (docs/data/bench_verify.json's): memory the upper
    bound of every row that is least over them in all (a linear program: a config is refused on
    it), time by non-negative least squares on relative error (``python -m conformance bench
    --verify --fit`` prints them; a test keeps the module's equal to them)."""
    from scipy.optimize import linprog, nnls

    memory, time_ = [], []
    for r in rows:
        config, images, batch = row_plan(r)
        taps, params = sizes(config)
        peak = r["peak_gb"] * 1e9
        memory.append(([1.0, taps * batch, params], peak))
        cases = len(FULL_SIZE)  # every row is a full-size plan
        per_image = [forward_flops(config) / 1e9 * images, taps / 1e6 * images]
        time_.append(([cases, cases * params / 1e6, *per_image], r["seconds"]))

    def relative(system):
        return np.array([f for f, _ in system]) / np.array([[y] for _, y in system])

    # memory: minimise the rows' summed relative over-estimate, sum_i a_i . c, with a_i . c >= 1 for
    # every row, c >= 0 (a in GB units). Not the largest over-estimate: the small rows' peaks are
    # mostly the interpreters' (0.96 to 1.15 GB between runs), whose scatter would then set the
    # per-element terms that decide the large configs
    a = relative(memory) * np.array([1e9, 1.0, 1.0])
    bound = linprog(c=a.sum(axis=0), A_ub=-a, b_ub=-np.ones(len(a)), bounds=[(0, None)] * 3)
    base, per_tap, per_param = bound.x * np.array([1e9, 1.0, 1.0]) * (1 + 2e-4)  # still a bound at five digits
    per_case, per_mparam, per_gflop, per_mtap = nnls(relative(time_), np.ones(len(time_)))[0]
    return {
        "BASE": base,
        "PER_TAP_ELEMENT": per_tap,
        "PER_PARAMETER": per_param,
        "SECONDS_PER_CASE": per_case,
        "SECONDS_PER_MEGA_PARAMETER": per_mparam,
        "SECONDS_PER_GFLOP": per_gflop,
        "SECONDS_PER_MEGA_TAP": per_mtap,
    }
