"""``python -m conformance bench [--verify]``: the ports' speed and memory beside timm's
(conformance.bench), or verification's own time and memory and the estimates fitted to them
(conformance.verify.bench); printed, written as JSON, or as docs/performance.md's table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conformance.bench import MODELS, run
from conformance.commands.docs import bench_table
from conformance.verify import bench as verify_bench


def main(args) -> int:
    models = args.models or list(MODELS)
    result = run(models, tuple(args.batches), args.warmup, args.repeats)
    m = result["machine"]
    print(
        f"\nmachine: {m['processor']}, {m['cores']} cores; float32 matmul peak (2048^2): "
        + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in m["matmul_peak_gflops"].items())
        + f"; MLX cblas_sgemm from {m['mlx_sgemm']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        print("\n" + bench_table(result))
    return 0


DATA = Path(__file__).resolve().parents[2] / "docs" / "data" / "bench_verify.json"  # a checkout's


def verify_main(args) -> int:
    if args.fit is not None:  # True: the checkout's recorded rows
        path = DATA if args.fit is True else Path(args.fit)
        rows = _rows(path)
        if isinstance(rows, str):
            print(f"usage error: --fit {path}: {rows}", file=sys.stderr)
            return 2
        for name, value in verify_bench.fit(rows).items():
            print(f"{name} = {value:.5g}")
        return 0
    configs = verify_bench.CONFIGS
    if args.models:  # the rows of those presets (every size of each)
        configs = [c for c in verify_bench.CONFIGS if c[1] in args.models]
        if not configs:
            print(
                f"no verify benchmark row for {', '.join(args.models)}: the rows are of {sorted({c[1] for c in verify_bench.CONFIGS})}"
            )
            return 2
    result = verify_bench.run(configs, port=getattr(args, "verify_port", None) or "torch")
    text = json.dumps(result, indent=1) + "\n"
    if args.json:
        Path(args.json).write_text(text)
    else:
        print(text)
    return 0


def _rows(path: Path) -> list | str:
    """The rows of a verify benchmark's JSON, or why there are none to fit."""
    if not path.is_file():
        return (
            "no such file (a checkout holds docs/data/bench_verify.json; elsewhere measure first: "
            "python -m conformance bench --verify --json FILE, then --fit FILE)"
        )
    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"not a verify benchmark's JSON (an object with its 'rows'): {e}"
    if not isinstance(rows, list) or not rows:
        return "its 'rows' are empty: nothing to fit"
    return rows
