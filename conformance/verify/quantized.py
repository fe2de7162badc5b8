"""A quantized port's two verdicts (docs/quantization.md).

**Kernel exactness**: the oracle runs on the port's own weights as its kernels compute with them
(``Quantized.values``, read back from its packed tensors), and every stage is judged against the
usual rounding bounds: a wrong scale, group, bit order or zero point *in the kernel* is located
at its stage. **Quantization cost**: each weight must lie within half a step of its group from
the float weight it came from (else the quantizer, not the rounding, moved it), and each stage's
distance from the float model is measured (relative error, SQNR, cosine); where the stage reads a
quantized weight, beside what the steps explain: the stage computed from the float model's inputs
to it on the quantized weights, and on weights moved by uniform noise of each weight's allowed
distance (``NOISE_RUNS`` draws). The ratio of the first's RMS distance from the float stage to the
draws' is about 1 for a quantizer that rounds to its grid; beyond ``cost_tolerance()``
(calibrated, ``quantization_calibration.json``) the stage costs more than its quantization explains."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from conformance.capture.quantized import slack
from conformance.returned import Quantized
from conformance.numerics.error_model import CaseModel
from conformance.numerics.roundings import Precision
from impls import numpy_vit
from impls.protocol import ViTConfig
from impls.stages import param_stage

NOISE_RUNS = 3
# The fewest independent roundings a stage's cost ratio is judged on: its elements, at most the quantized
# weights it reads (a 2-wide projection's 18 outputs come from 4 weights' roundings), and at most the
# directions its noise draws spread over (``participation``: a 6-wide head's 12 logits over three like
# images vary along about four). Under a
# quantizer that rounds to its grid the ratio squared is about F(n, NOISE_RUNS n) over n of them (one
# rounding realisation over the draws' noise): at the tolerance (2.83) its tail is 6.6 % for n = 1,
# 9e-5 for 7 and 5e-7 for 12 (scipy.stats.f.sf). Below, the ratio is shown, not judged: too few to tell
# a quantizer's cost from its rounding; every weight is still held to its half step (``beyond_half_step``).
COST_MIN_ELEMENTS = 12
_CALIBRATION = Path(__file__).with_name("quantization_calibration.json")


def cost_tolerance() -> float:
    """The largest cost ratio calibrated on correct quantizations, times its margin."""
    data = json.loads(_CALIBRATION.read_text())
    return float(data["margin"]) * float(data["max_ratio"])


def kernel_state(state, quantized: Quantized) -> dict:
    """The canonical state with each quantized parameter as the port's kernels compute with it."""
    return {**state, **quantized.values}


def weight_stage(key: str, config: ViTConfig, rows: np.ndarray) -> str:
    """The stage a parameter's rows feed (a fused qkv's rows: q, k or v)."""
    stage = param_stage(key)
    if key.endswith("attn.qkv.weight") and rows.size:
        return stage[: -len("q")] + "qkv"[min(int(rows.min()) // config.embed_dim, 2)]
    return stage


def allowed(quantized: Quantized, key: str, w: np.ndarray, dtype: str) -> np.ndarray:
    """How far each entry of a quantized weight may lie from its float weight ``w``: its half step,
    and the dtype's rounding (``conformance.capture.quantized.slack``)."""
    return quantized.steps[key] + slack(w, quantized.reach[key], dtype)


def beyond_half_step(quantized: Quantized, state, config: ViTConfig, dtype: str) -> list[tuple]:
    """(stage, reason, the bug named or None) for each quantized weight some of whose entries lie
    farther from their float weight than ``allowed``: half a step of their group, and the rounding
    of the weight and of its group's scale and bias to the dtype."""
    found = []
    for key, value in quantized.values.items():
        w = np.asarray(state[key], np.float64)
        half = quantized.steps[key]
        err = np.abs(value - w)
        beyond = err > allowed(quantized, key, w, dtype)
        if not beyond.any():
            continue
        rows = np.nonzero(beyond.reshape(w.shape[0], -1).any(axis=1))[0] if w.ndim > 1 else np.zeros(0, int)
        with np.errstate(divide="ignore", invalid="ignore"):
            steps = np.max(np.where(half > 0, err / (2 * half), np.inf)[beyond])
        why = "the quantization moved them, not rounding to its grid"
        if key in quantized.coarse:
            why = (
                f"its grid's scale is up to {quantized.coarse[key]:.3g}x the largest the format's quantizer gives "
                "the group (its range over its levels): a grid that coarse cannot hold the float weights"
            )
        found.append(
            (
                weight_stage(key, config, rows),
                f"{int(beyond.sum())} of {w.size} entries of {key} lie beyond half a step of their group from "
                f"the float weight (up to {steps:.3g} steps away): {why}",
                quantized.named.get(key),
            )
        )
    return found


def _rms(x) -> float:
    return float(np.sqrt(np.mean(np.square(x)))) if np.size(x) else 0.0


def reading_stages(keys) -> set[str]:
    """The stages whose operation reads one of the quantized weights ``keys`` (a fused qkv's: q's,
    k's and v's)."""
    stages = {param_stage(k) for k in keys}
    return stages | {s[: -len("q")] + part for s in stages if s.endswith(".attn.q") for part in "kv"}


def cost_rows(out, reference, local: dict[str, tuple]) -> list[dict]:
    """Per stage the port emitted: its distance from the float model ``reference`` (relative
    error, SQNR in dB, cosine), and where its operation reads a quantized weight, ``local[stage]``
    = (the stage on quantized weights, [the stage on noisy weights], the quantized weights it reads),
    each from the float model's inputs to it: the ``ratio`` of the first's RMS distance from the float
    stage to the second's, and ``roundings``, the independent roundings it sees at most."""
    rows = []
    for name, ref in reference.items():
        if name not in out:
            continue
        with np.errstate(all="ignore"):  # a port's non-finite stage: its figures are inf and NaN, as they are
            rows.append(_cost_row(name, np.asarray(ref, np.float64), out[name], local.get(name)))
    return rows


def _cost_row(name: str, ref: np.ndarray, port, local) -> dict:
    """``local``: None, or (the stage on quantized weights, [on noisy weights], the weights it reads)."""
    port = np.asarray(port, np.float64).reshape(ref.shape)
    diff = port - ref
    power, noise = float(np.sum(ref * ref)), float(np.sum(diff * diff))
    norms = np.linalg.norm(port) * np.linalg.norm(ref)
    ratio, read = None, ref.size
    if local is not None:
        quantized, noisy, read = local
        expected, moved = np.sqrt(np.mean([_rms(n - ref) ** 2 for n in noisy])), _rms(quantized - ref)
        ratio = moved / expected if expected else (0.0 if moved == 0 else np.inf)
        read = min(read, participation([n - ref for n in noisy]))
    return {
        "stage": name,
        "rel_error": float(np.sqrt(noise / power)) if power else 0.0,
        "sqnr_db": float(10 * np.log10(power / noise)) if noise and power else float("inf"),
        "cosine": float(np.sum(port * ref) / norms) if norms else 1.0,
        "ratio": None if ratio is None else float(ratio),
        "roundings": float(min(ref.size, read)),  # the independent roundings it sees, at most
    }


def participation(draws: list[np.ndarray]) -> float:
    """How many independent directions the noise draws' deviations spread over: (tr C)^2 / |C|_F^2
    for their covariance C, from E|d|^2 = tr C and E (d_r . d_s)^2 = |C|_F^2 over pairs of draws (a
    one-class head's logits over three images vary along one direction, not three)."""
    flat = [np.ravel(d) for d in draws]
    pairs = [float(np.dot(a, b)) ** 2 for i, a in enumerate(flat) for b in flat[i + 1 :]]
    trace, frobenius = np.mean([float(np.dot(d, d)) for d in flat]), np.mean(pairs) if pairs else 0.0
    return trace * trace / frobenius if frobenius > 0 else float(np.size(flat[0]) if flat else 0)


def costs_too_much(row: dict) -> bool:
    """Whether a stage's cost ratio is judged (``COST_MIN_ELEMENTS`` roundings) and beyond the tolerance."""
    return row["ratio"] is not None and row["roundings"] >= COST_MIN_ELEMENTS and row["ratio"] > cost_tolerance()


def costs_more(row: dict) -> str:
    """A stage whose quantization costs more than its steps explain, in words."""
    return (
        f"the quantized model's distance from the float model is {row['ratio']:.3g}x what its weights' half "
        f"steps explain (tol {cost_tolerance():.3g}; SQNR {row['sqnr_db']:.1f} dB): the quantization, not "
        "its rounding, moved the weights this stage reads"
    )


def record_cost(report, what: str, rows: list[dict], label: str) -> None:
    """Each stage's cost on its worst case so far (the lowest SQNR) and its largest ratio over the
    cases, in ``report.quantization``."""
    if report.quantization is None:
        report.quantization = {"what": what, "cost": {}}
    cost = report.quantization["cost"]
    for row in rows:
        kept = cost.get(row["stage"])
        ratios = [r for r in (row["ratio"], kept and kept["ratio"]) if r is not None]
        if kept is None or row["sqnr_db"] < kept["sqnr_db"]:
            kept = cost[row["stage"]] = {**row, "case": label}
        kept["ratio"] = max(ratios) if ratios else None


def noisy_states(state, quantized: Quantized, dtype: str, seed: int = 0) -> list[dict]:
    """The float state with each quantized weight moved by uniform noise over what it is
    ``allowed`` (its half step and the dtype's rounding), ``NOISE_RUNS`` times."""
    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(NOISE_RUNS):
        run = dict(state)
        for k in quantized.values:
            w = np.asarray(state[k], np.float64)
            run[k] = w + rng.uniform(-1, 1, w.shape) * allowed(quantized, k, w, dtype)
        runs.append(run)
    return runs


def quantization_cost(out, case, config: ViTConfig, dtype: str) -> list[dict]:
    """The cost rows of one case: the float oracle's stages, and each stage that reads a quantized
    weight computed from the float oracle's inputs to it on the quantized and the noisy weights
    (local: a saturated softmax downstream flips on one draw and not another, and no ratio of two
    draws of a chaotic stage means anything; the stage that reads the weights is linear in them)."""
    quantized = out.quantized
    reference = numpy_vit.make(config, case.state)(case.images)
    models = [
        CaseModel(config, s, case.images, dtype)
        for s in (kernel_state(case.state, quantized), *noisy_states(case.state, quantized, dtype))
    ]
    local = {}
    for name in reading_stages(quantized.values) & set(reference):
        values = [m.local(name, reference)[0] for m in models]
        local[name] = (values[0], values[1:], weights_read(quantized.values, name))
    return cost_rows(out, reference, local)


def weights_read(values: dict, stage: str) -> int:
    """How many quantized weights ``stage``'s operation reads (a fused qkv's third each for q, k, v)."""
    n = 0
    for key, value in values.items():
        stages = reading_stages([key])
        n += np.size(value) // len(stages) if stage in stages else 0
    return n


class KernelModel(CaseModel):
    """The error model of a quantized port's case: the oracle on its own weights, and in a dtype
    coarser than float32 each contraction over a quantized weight accumulated in that dtype:
    MLX's CPU ``quantized_matmul`` does (measured in bfloat16 at K = 256: an RMS error of 4.9
    u·m against its dequantized weights, where its float matmul shows 1.2 u·m,
    docs/quantization.md); the bound of an accumulation in the dtype holds whatever the order."""

    def __init__(self, config: ViTConfig, state, quantized: Quantized, images, dtype: str, stream: bool = False):
        super().__init__(config, kernel_state(state, quantized), images, dtype, stream=stream)
        self.accumulating = reading_stages(quantized.values)
        self.levels = {s: n for k, n in quantized.input_levels.items() for s in reading_stages([k])}

    def _precision(self, name: str, precision: Precision | None) -> Precision:
        precision = precision or self.precision
        if name in self.levels:
            precision = replace(precision, input_levels=self.levels[name])
        if name in self.accumulating and precision.dtype not in ("float32", "float64"):
            return replace(precision, accumulate=precision.dtype)
        return precision

    def evaluate(self, name, t, precision=None):
        return super().evaluate(name, t, self._precision(name, precision))

    def evaluate_runs(self, name, t, runs, precision):
        return super().evaluate_runs(name, t, runs, self._precision(name, precision))
