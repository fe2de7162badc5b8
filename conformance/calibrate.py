"""Measure the error of the correct ports against the float64 oracle and write the policy data.

    python -m conformance.calibrate [--examples 400] [--seed 0] [--out conformance/calibration.json]

Draws cases with the suite's own strategies (configs, images of every kind, weights at normal
and stress scales and with a large common offset), then runs the timm presets at 224 (whose
reductions are wider than any drawn config), through every built-in framework port with taps,
and records for each stage kind, regime and port the distribution of
rel_err = max|port - oracle| / max|oracle|.
conformance/tolerances.py turns the per-kind maximum into a threshold with a margin.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed

from conformance import strategies as S
from conformance.compare import error, stage_kind
from impls import FRAMEWORK_PORTS, get_config, load_factory

DEFAULT_OUT = Path(__file__).with_name("calibration.json")
PRESET_NAMES = ("vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224")


def measure(examples: int, seed: int, ports=FRAMEWORK_PORTS, presets=PRESET_NAMES) -> dict:
    factories = {p: load_factory(p) for p in ("numpy", *ports)}
    errors: dict = defaultdict(list)  # (regime, kind, port) -> [rel_err]
    worst: dict = {}  # (regime, kind, port) -> the case behind the largest rel_err

    def record(regime, config, state, x, case_info):
        oracle = factories["numpy"](config, state)(x)
        for port in ports:
            out = factories[port](config, state)(x)
            for stage, ref in oracle.items():
                key = (regime, stage_kind(stage), port)
                rel = error(out[stage], ref)[1]
                if not errors[key] or rel >= max(errors[key]):
                    worst[key] = {**case_info, "stage": stage}
                errors[key].append(rel)

    @hypothesis_seed(seed)
    @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(config=S.configs(), weights=S.weight_cases(), images=S.image_cases())
    def run(config, weights, images):
        state = weights.make(config)
        x = (S.ImageCase("ordinary", images.seed, images.batch) if weights.offset else images).make(config)
        record(weights.regime, config, state, x,
               {"config": config.to_dict(), "weights": vars(weights), "images": vars(images)})

    run()
    for name in presets:  # full-size shapes: wider reductions than the drawn configs
        config = get_config(name)
        state = S.WeightCase(seed, 1.0).make(config)
        for kind in ("ordinary", "near_constant"):
            record("normal", config, state, S.make_images(config, 2, kind, seed), {"preset": name, "images": kind})
    table: dict = {}
    for (regime, kind, port), values in sorted(errors.items()):
        v = np.asarray(values)
        entry = table.setdefault(regime, {}).setdefault(kind, {})
        entry[port] = {"n": int(v.size), "p50": float(np.median(v)), "p99": float(np.quantile(v, 0.99)),
                       "max": float(v.max()), "worst_case": worst[(regime, kind, port)]}
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.calibrate", description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    table = measure(args.examples, args.seed)
    payload = {"examples": args.examples, "seed": args.seed, "seconds": round(time.perf_counter() - t0, 1),
               "metric": "max|port - oracle| / max|oracle| per stage tensor, float32 ports",
               "errors": table}
    args.out.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    print(f"{'regime':8} {'stage kind':14} " + " ".join(f"{p + ' max':>11}" for p in FRAMEWORK_PORTS))
    for regime, kinds in table.items():
        for kind, ports in kinds.items():
            print(f"{regime:8} {kind:14} " + " ".join(f"{ports[p]['max']:11.3e}" for p in FRAMEWORK_PORTS))
    print(f"wrote {args.out} in {payload['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
