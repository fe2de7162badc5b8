"""The quantization cost's calibration: ``python -m conformance calibrate --quantized``
writes ``quantization_calibration.json``, the largest ratio (``conformance.verify.quantized``)
over correct quantizations: MLX's nn.quantize in every mode, width and group size the preset
takes, in float32, bfloat16 and float16, and timm's ViT after torch.ao's dynamic int8 and
torchao's int8 weight-only in float32, on every seeded case of ``vit_test_quantized`` and two
seeds. The tolerance is ``MARGIN`` times that."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from conformance.numerics.precision import PORT_DTYPES
from conformance.examples import quantized as q
from conformance.verify.cases import default_cases
from conformance.verify.quantized import beyond_half_step, quantization_cost
from impls import get_config

MARGIN = 1.5
SETTINGS = [("affine", bits, group) for bits in (2, 3, 4, 5, 6, 8) for group in (32, 64)] + [
    ("mxfp4", 4, 32),
    ("mxfp8", 8, 32),
    ("nvfp4", 4, 16),
]


def ports():
    """(name, port, dtype) of every correct quantization calibrated."""

    for (mode, bits, group), dtype in itertools.product(SETTINGS, PORT_DTYPES):
        yield f"{mode} {bits} bits, groups of {group}, {dtype}", q.mlx_image(bits, group, mode), dtype
    yield "torch.ao dynamic int8, float32", q.timm_int8, "float32"
    yield "torchao int8 weight-only, float32", q.timm_torchao_int8, "float32"


def measure(seeds=(0, 1)) -> dict:
    config = get_config("vit_test_quantized")
    worst: dict[str, list] = {}
    for (key, port, dtype), seed in itertools.product(list(ports()), seeds):
        for case in default_cases(config, seed=seed):
            out = port(config, case.state, dtype)(case.images)
            moved = beyond_half_step(out.quantized, case.state, config, dtype)
            if moved or out.quantized.named:  # a correct quantization's weights: within half a step
                raise AssertionError(f"{key} {case.name}: {moved[:1]} {out.quantized.named}")
            for row in quantization_cost(out, case, config, dtype):
                if row["ratio"] is not None and row["ratio"] > worst.get(key, [0.0])[0]:
                    worst[key] = [row["ratio"], row["stage"], f"seed {seed}: {case.name}"]
    return worst


def main(argv=None) -> int:
    """Writes conformance/verify/quantization_calibration.json (beside the verdict that reads it)."""
    worst = measure()
    top = max(v[0] for v in worst.values())
    data = {"margin": MARGIN, "max_ratio": top, "by_setting": worst}
    path = Path(__file__).resolve().parents[1] / "verify" / "quantization_calibration.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"max ratio {top:.3g} over {len(worst)} settings: tolerance {MARGIN * top:.3g} ({path})")
    return 0
