"""``python -m conformance calibrate``: every calibration the bounds read, measured on correct code.

    python -m conformance calibrate [--examples 300] [--low-precision-every 3] [--seed 0]
                                    [--out conformance/numerics/calibration.json]
    python -m conformance calibrate --grad [--cases N] [--dtype D]    the gradient bound's
    python -m conformance calibrate --quantized                       the quantization cost's
    python -m conformance calibrate --scan | --scan-full              the scan's bands

The forward bound's, here:
Draws whole-model cases with the suite's own strategies (configs, images of every kind,
seeded weights at every scale and offset, trained-like weights), the hard cases
(hard_cases.json: where a correct port was once measured far out), then runs the timm presets
at 224 (whose reductions are wider than any drawn config) on seeded, trained-like and x64
weights (twelve blocks of saturated softmaxes: where the model turns chaotic), through every
built-in framework port with taps, in float32 and (on every n-th case)
bfloat16 and float16, and its fast path (logits only); then standalone attention (the
explicit and fused paths of every framework, with masks) and raw scaled-dot-product
attention against each framework's fused kernel. For each dtype, mode (local, end to end, and
end to end on chaotic stages, whatever their kind: tolerances.CHAOTIC),
stage kind and port it records the distribution of the ratio of the error to the error
model's bound, the case behind the largest, and what produced it (versions, BLAS, CPU).
conformance/numerics/tolerances.py turns the per-kind maximum into a tolerance with a margin.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from conformance import strategies as S
from conformance.builtin import FUSED, framework, qkv_arrays
from conformance.commands import calibrate_quantized, calibrate_scan_full
from conformance.diagnosis import scan
from conformance.numerics import error_model as E
from conformance.numerics import gradients, provenance
from conformance.numerics.compare import ratio_over_bound, stage_ratios
from conformance.numerics.tolerances import CHAOTIC, CHAOTIC_KIND, CHAOTIC_MODE, is_chaotic
from impls import FRAMEWORK_PORTS, PORTS, ViTConfig, get_config, load_factory

NUMERICS = Path(__file__).resolve().parents[1] / "numerics"  # where the calibrations live, beside their readers
DEFAULT_OUT = NUMERICS / "calibration.json"
PRESET_NAMES = ("vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224")
LOW_PRECISION = ("bfloat16", "float16")
FAST = {"torch": dict(fused_attn=True), "mlx": dict(fused_attn=True, compiled=True), "jax": dict(fused_attn=True)}


SPREAD_BINS = (0.0, 1e-3, 1e-2, 0.03, CHAOTIC, 0.3, 1.0, float("inf"))


class Recorder:
    def __init__(self):
        self.values: dict = defaultdict(list)  # (dtype, mode, kind, port) -> [ratio]
        self.worst: dict = {}
        self.skipped: list = []
        self.by_spread: dict = defaultdict(list)  # (dtype, upper edge of the relative spread's bin) -> [ratio]

    def add_end_to_end(self, dtype: str, kind: str, port: str, r: dict, info: dict) -> None:
        """An end-to-end ratio (``stage_ratios``'s), to its kind's or, past the linear regime, to
        the chaotic stages' of every kind (tolerances.CHAOTIC)."""
        # the last bin holds an infinite spread too (a stage of zeros moved by its runs' rounding: a
        # LayerNorm over one feature)
        edge = next((e for e in SPREAD_BINS[1:] if r["relative_spread"] < e), SPREAD_BINS[-1])
        self.by_spread[(dtype, edge)].append(r["end-to-end"])
        if is_chaotic(r["relative_spread"]):
            key = (dtype, CHAOTIC_MODE, CHAOTIC_KIND, port)
            info = {**info, "kind": kind, "relative_spread": r["relative_spread"]}
        else:
            key = (dtype, "end-to-end", kind, port)
        self.add(key, r["end-to-end"], info)

    def add(self, key, ratio: float, info: dict) -> None:
        if not np.isfinite(ratio):  # a correct port must not produce it: the calibration stops here
            raise ValueError(f"non-finite error ratio {ratio} for {key} on {info}")
        if not self.values[key] or ratio >= max(self.values[key]):
            self.worst[key] = info
        self.values[key].append(ratio)

    def spread_table(self) -> dict:
        """Per dtype and bin of the relative spread, the end-to-end ratios' count and largest: where
        the linear regime ends (tolerances.CHAOTIC)."""
        out: dict = {}
        for (dtype, edge), values in sorted(self.by_spread.items()):
            lower = SPREAD_BINS[SPREAD_BINS.index(edge) - 1]
            out.setdefault(dtype, {})[f"[{lower:g}, {edge:g})"] = {"n": len(values), "max": float(max(values))}
        return out

    def table(self) -> dict:
        out: dict = {}
        for (dtype, mode, kind, port), values in sorted(self.values.items()):
            v = np.asarray(values)
            out.setdefault(dtype, {}).setdefault(mode, {}).setdefault(kind, {})[port] = {
                "n": int(v.size),
                "p50": float(np.median(v)),
                "p99": float(np.quantile(v, 0.99)),
                "max": float(v.max()),
                "worst_case": self.worst[(dtype, mode, kind, port)],
            }
        return out


def record_model(rec: Recorder, factories, config, state, x, info, dtypes, ports=FRAMEWORK_PORTS) -> None:
    for dtype in dtypes:
        model = E.CaseModel(config, state, x, dtype)
        if model.beyond_range():  # float16 on huge images: no port can represent it
            rec.skipped.append({**info, "dtype": dtype, "why": model.beyond_range()})
            continue
        for port in ports:
            out = factories[port](config, state, dtype=dtype)(x)
            for name in model.names:
                r = stage_ratios(name, out[name], model, out)
                kind = model.kind(name)
                rec.add((dtype, "local", kind, port), r["local"], {**info, "stage": name})
                rec.add_end_to_end(dtype, kind, port, r, {**info, "stage": name})
            if dtype == "float32":  # the fast path emits logits only: end to end
                fast = factories[port](config, state, taps=False, **FAST[port])(x)
                rec.add_end_to_end(
                    dtype,
                    "logits",
                    port,
                    stage_ratios("logits", fast, model, {}, local=False),
                    {**info, "stage": "logits", "path": "fast"},
                )


def record_attention(rec: Recorder, case, mask, info) -> None:
    """A standalone attention's (out, weights), explicit and fused, end to end."""

    model = case.error_model(mask=mask)
    for port in FRAMEWORK_PORTS:
        module = __import__(PORTS[port].split(":")[0], fromlist=["make_attention"])
        for fused in (False, True):
            out, weights = module.make_attention(case.state, **case.options, fused_attn=fused)(
                case.x, case.context, mask
            )
            for name, value in (("attn", out), ("attn.weights", weights)):
                if value is not None:
                    r = stage_ratios(name, value, model, {}, local=False)
                    rec.add_end_to_end("float32", model.kind(name), port, r, {**info, "stage": name, "fused": fused})


def record_sdpa(rec: Recorder, shape: S.AttentionShape, scale: float, mask, info) -> None:
    """Each framework's explicit path and its fused kernel from given q, k, v, locally."""

    q, k, v = qkv_arrays(shape, scale)
    s = shape.head_dim**-0.5
    ref, dref, P, dP = E.sdpa(q, k, v, mask, s)
    for port in FRAMEWORK_PORTS:
        module, to_fw, to_np = framework(port)
        args = [to_fw(a) for a in (q, k, v)] + [None if mask is None else to_fw(mask)]
        explicit, weights = module.scaled_dot_product_attention(*args, scale=s)
        fused = FUSED[port](module, *args, s)
        for kind, value, expected, bound in (
            ("sdpa.out", to_np(explicit), ref, dref),
            ("sdpa.out", to_np(fused), ref, dref),
            ("sdpa.weights", to_np(weights), P, dP),
        ):
            err = np.abs(np.asarray(value, np.float64) - expected)
            rec.add(("float32", "local", kind, port), ratio_over_bound(err, bound + E.SMALLEST_NORMAL["float32"]), info)


# Cases a correct port was once measured far out on, each with where and how far, kept whatever the
# draws: a redrawn calibration that loses a worst case loses the tolerance it set, and verify then
# calls a correct port NOT CONFORMANT (the calibration of b6f565c did, on timm's Perception Encoder)
HARD_CASES_FILE = NUMERICS / "hard_cases.json"
WEIGHTS = {"WeightCase": S.WeightCase, "TrainedLike": S.TrainedLike}


def hard_cases(path: Path = HARD_CASES_FILE) -> list[tuple[ViTConfig, object, S.ImageCase]]:
    cases = []
    for entry in json.loads(path.read_text())["cases"]:
        ((kind, args),) = entry["weights"].items()
        images = dict(entry["images"])
        images["grid"] = tuple(images["grid"]) if images.get("grid") else None
        cases.append((ViTConfig.from_dict(entry["config"]), WEIGHTS[kind](**args), S.ImageCase(**images)))
    return cases


def hard_cases_digest(path: Path = HARD_CASES_FILE) -> str:
    """What calibration.json records of the hard cases it ran: a calibration older than the file
    lacks the cases added since (tests/test_calibration.py)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record_hard_cases(rec: Recorder, factories) -> None:
    for config, weights, images in hard_cases():
        info = {"config": config.to_dict(), "weights": repr(weights), "images": vars(images), "hard case": True}
        record_model(
            rec, factories, config, weights.make(config), images.make(config), info, ("float32", *LOW_PRECISION)
        )


def measure(examples: int, seed: int, low_every: int = 3, presets=PRESET_NAMES, attention_examples: int = 100) -> dict:
    factories = {p: load_factory(p) for p in FRAMEWORK_PORTS}
    rec = Recorder()
    count = [0]

    @hypothesis_seed(seed)
    @settings(
        max_examples=examples, database=None, deadline=None, derandomize=False, suppress_health_check=list(HealthCheck)
    )
    @given(config=S.configs(family="half"), weights=S.model_weights(), images=S.image_cases())
    def run(config, weights, images):
        count[0] += 1
        dtypes = ("float32", *LOW_PRECISION) if count[0] % low_every == 0 else ("float32",)
        record_model(
            rec,
            factories,
            config,
            weights.make(config),
            images.make(config),
            {"config": config.to_dict(), "weights": repr(weights), "images": vars(images)},
            dtypes,
        )

    run()
    record_hard_cases(rec, factories)
    for name in presets:  # full-size shapes: wider reductions than the drawn configs
        config = get_config(name)
        # x64 on ordinary images: saturated softmaxes twelve blocks deep, where the model turns chaotic
        for weights, kinds in (
            (S.WeightCase(seed, 1.0), ("ordinary", "near_constant")),
            (S.TrainedLike(seed), ("ordinary", "near_constant")),
            (S.WeightCase(seed, 64.0), ("ordinary",)),
        ):
            for kind in kinds:
                record_model(
                    rec,
                    factories,
                    config,
                    weights.make(config),
                    S.make_images(config, 2, kind, seed),
                    {"preset": name, "weights": repr(weights), "images": kind},
                    ("float32", *LOW_PRECISION),
                )

    @hypothesis_seed(seed)
    @settings(max_examples=attention_examples, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=S.attention_property_cases(), data=st.data(), big=st.booleans())
    def attention(case, data, big):
        shape = S.attention_shape_of(case)
        mask = data.draw(st.one_of(st.none(), S.masks(shape)))
        if big:  # logits in the hundreds
            case = type(case)(
                case.options, case.state, case.x * 30, None if case.context is None else case.context * 30, case.info
            )
        record_attention(rec, case, mask, {"attention": case.options, "mask": mask is not None, "x30": big})

    attention()

    @hypothesis_seed(seed)
    @settings(max_examples=attention_examples, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(shape=S.attention_shapes(), data=st.data(), scale=st.sampled_from([0.3, 1.0, 3.0]))
    def sdpa(shape, data, scale):
        mask = data.draw(st.one_of(st.none(), S.masks(shape, allow_dead_rows=False)))
        record_sdpa(rec, shape, scale, mask, {"shape": vars(shape), "scale": scale, "mask": mask is not None})

    sdpa()
    return rec.table(), rec.skipped, rec.spread_table()


def main(argv=None) -> int:
    """``calibrate [--grad | --quantized | --scan | --scan-full] ...``: the forward bound's (here),
    the gradient bound's, the quantization cost's, the scan's bands (small configs, full size)."""
    argv = list(argv or [])
    for flag, other in {"--grad": grad_main, "--quantized": calibrate_quantized.main, "--scan": scan_main}.items():
        if flag in argv:
            return other([a for a in argv if a != flag])
    if "--scan-full" in argv:
        return calibrate_scan_full.main([a for a in argv if a != "--scan-full"])
    return forward_main(argv)


def forward_main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance calibrate", description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--low-precision-every", type=int, default=3, help="bf16 and fp16 on every n-th drawn case")
    parser.add_argument("--attention-examples", type=int, default=100)
    parser.add_argument(
        "--presets", nargs="*", default=list(PRESET_NAMES), help="full-size presets to run (none: --presets)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    table, skipped, by_spread = measure(
        args.examples, args.seed, args.low_precision_every, tuple(args.presets), args.attention_examples
    )
    payload = {
        "examples": args.examples,
        "seed": args.seed,
        "presets": args.presets,
        "hard_cases_sha256": hard_cases_digest(),
        "seconds": round(time.perf_counter() - t0, 1),
        "metric": "error over the error model's bound (conformance/numerics/error_model.py), per stage",
        "provenance": provenance.collect(),
        "ratios": table,
        "end_to_end_by_relative_spread": by_spread,
        "skipped_beyond_range": [
            {"dtype": c["dtype"], "why": c["why"], "weights": c.get("weights"), "images": c.get("images")}
            for c in skipped
        ],
    }
    args.out.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    for dtype, modes in table.items():
        for mode, kinds in modes.items():
            for kind, ports in kinds.items():
                print(f"{dtype:9} {mode:11} {kind:14} " + " ".join(f"{p} {v['max']:8.3g}" for p, v in ports.items()))
    print(f"wrote {args.out} in {payload['seconds']} s")
    return 0


def grad_main(argv=None) -> int:
    """``python -m conformance calibrate --grad [--cases N] [--dtype D]``: writes grad_calibration.json."""
    parser = argparse.ArgumentParser(
        prog="python -m conformance calibrate --grad", description="calibrate the gradient bound on the correct ports"
    )
    parser.add_argument("--cases", type=int, default=60)
    parser.add_argument("--dtype", default="float32", choices=gradients.GRAD_DTYPES)
    args = parser.parse_args(argv)
    print(json.dumps(calibrate_gradients(args.cases, dtype=args.dtype), indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def scan_main(argv=None) -> int:
    """``calibrate --scan``: the scan's bands on the correct ports (small configs), into its calibration."""
    parser = argparse.ArgumentParser(
        prog="python -m conformance calibrate --scan", description="measure the scan on the correct ports"
    )
    parser.add_argument("--out", type=Path, default=scan.CALIBRATION)
    args = parser.parse_args(argv)
    record = json.loads(args.out.read_text()) if args.out.exists() else {}
    record.update(scan.calibrate())  # the full-size keys (scan_full) kept
    args.out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def calibrate_gradients(cases: int = 60, ports=("torch", "mlx", "jax"), seed: int = 0, dtype: str = "float32") -> dict:
    """Largest ratio of the correct ports computing in ``dtype``, per kind (taps, params,
    images), over drawn configs (the family's options in half of them, as the forward's
    calibration), weights seeded at every scale and offset and trained-like ones, ordinary
    images, batches of 1 to 3 and both losses; written to grad_calibration.json under the dtype."""
    largest = {of: dict.fromkeys(ports, 0.0) for of in gradients.KINDS}
    where: dict = {of: {} for of in gradients.KINDS}
    count = [0]

    @hypothesis_seed(seed)
    @settings(
        max_examples=cases,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(
        config=S.grad_configs(max_depth=2, family="half"),
        weights=S.model_weights(),
        batch=st.integers(1, 3),
        kind=st.sampled_from(["cross_entropy", "linear"]),
    )
    def run(config, weights, batch, kind):
        state = weights.make(config)
        images = S.make_images(config, batch, "ordinary", weights.seed % 2**20)
        model = gradients.GradModel(
            config, state, images, gradients.draw_loss(config, batch, kind, weights.seed % 2**20), dtype=dtype
        )
        if model.beyond_range():
            return
        for port in ports:
            got = importlib.import_module(f"impls.{port}_vit").make_grad(config, state, dtype=dtype)(images, model.loss)
            for of, name in [*((k, n) for k in ("taps", "params") for n in model.reference[k]), ("images", "images")]:
                ratio = model.ratio(of, name, got[of] if of == "images" else got[of][name])
                if ratio > largest[of][port]:
                    largest[of][port] = ratio
                    where[of][port] = {
                        "case": count[0],
                        "tensor": name,
                        "weights": repr(weights),
                        "config": config.to_dict(),
                    }
        count[0] += 1
        print(
            f"case {count[0]}: "
            + ", ".join(f"{p} " + " / ".join(f"{largest[of][p]:.2f}" for of in gradients.KINDS) for p in ports),
            flush=True,
        )

    run()
    record = {
        "cases": count[0],
        "seed": seed,
        "by_port": largest,
        "where": where,
        "largest_ratio": {of: max(largest[of].values()) for of in gradients.KINDS},
        "measure": "max |g_port - g_ref| / max |g_noisy - g_ref| per tensor (GradModel's noisy runs)",
    }
    existing = json.loads(gradients.CALIBRATION.read_text()) if gradients.CALIBRATION.exists() else {}
    gradients.CALIBRATION.write_text(json.dumps(existing | {dtype: record}, indent=1, default=str) + "\n")
    return record
