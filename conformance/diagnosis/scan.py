"""Systematic errors below a dtype's rounding: every class fitted at every stage that passes,
pooled over verify's cases.

A bug whose difference is below the dtype's rounding at every element (the tanh GELU in
bfloat16: 4.7e-4 against 2⁻⁸ |a|) passes the per-element check, but it is *systematic*: the same
sign and shape of error at every element, where a correct port's rounding is not. Over the
cases verify runs, at each stage a port passed locally, and for each class of the stage's kind
(``classes.classes_for``; the per-token family and the overflows' classes aside: where finite, an
overflow's difference is a rounding pattern), the sums of ``e d / b²``, ``d² / b²`` and ``e² / b²``
are pooled (``e`` the port's error, ``d`` the class's difference, ``b`` the local
bound), giving ``α`` and its standard error ``σ_α`` as the diagnosis's fit does. A port that computes
the class projects on its difference by about 1. Two rules. The open one, a significant share (``|α| ≥ ALPHA`` and ``|α| / σ_α ≥
SIGNIFICANCE``), is a measurement only: the correct ports trip it in bfloat16 and float16
(scan_calibration.json). Their LayerNorm reads inputs rounded to the dtype, whose variance is
biased up by the rounding's own (Sheppard's correction), along the direction a larger eps moves
the output (torch on vit_test_clip: α = 58.8 along eps outside the root in bfloat16, −8.3 along
eps 1e-6 in float16); MLX's and JAX's tanh GELU in bfloat16 sit 1.8 times its distance from the
exact GELU beyond the float64 tanh GELU (α = −1.8 along the exact GELU on vit_test_siglip), the
bias a tanh-GELU bug in bfloat16 adds to (the JAX mutant measures 2.7). The verdict's rule is the
diagnosis's own: a stage is **systematic**, NOT CONFORMANT, where the pooled error *is* a class's
difference (``named``: α = 1 within 3 σ_α + 1%, σ_α ≤ 0.03), which no correct port does in any
dtype on the calibration's cases; verify applies it in bfloat16 and float16 (in float32 the
per-element check already locates every class the zoo has).

The open rule, calibrated per class (``beyond``), is the verdict's too: a share the correct ports
never come near along that class in that dtype. The calibration records, per dtype and class, the
band of the correct ports' significant shares (``bands``: lowest and highest α, 0 where none is
significant); a share counts where it is significant, at least ``ALPHA``, and beyond ``MARGIN``
times the band on its side. The biases are arithmetic (a rounded input's variance, a GELU's
constants and intermediates rounded to the dtype), so they keep their sign: JAX's tanh GELU in
bfloat16 adds to a tanh-GELU bug (the JAX mutant measures 2.7 along it), where no correct port's
share is significant. LayerNorm and overflow classes are left out (``banded``). The stage's own
value is a direction too (``VALUE``: a relative scale error, whatever its cause), banded per stage
kind with a floor of one rounding. The calibration checks the bands on held-out cases (seed 1,
trained-like weights among them: ``held_out``, none), which ``tests/test_diagnosis.py`` asserts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from conformance.diagnosis.classes import BY_NAME, NORM_KINDS, classes_for
from conformance.diagnosis.fit import FLOOR, RESOLVED, SIGMAS, Diagnosis, Fit, _Values, well_formed
from conformance.numerics.compare import compare_outputs, stored_as
from conformance.numerics.kinds.activation import activation
from conformance.numerics.precision import PORT_DTYPES, UNIT_ROUNDOFF, rounded
from conformance.numerics.provenance import collect
from conformance.verify.cases import seeded_cases
from impls import FRAMEWORK_PORTS, get_config, load_factory
from impls.stages import stage_kind

ALPHA = 0.5  # a class's share of the error: a correct float32 port's is at most 0.014 (scan_calibration.json)
SIGNIFICANCE = 10.0  # |α| / σ_α: the share stands out of the rounding's scatter
MARGIN = 2.0  # beyond: a share past twice the correct ports' band along its class, as tolerances' margins
CALIBRATION = Path(__file__).with_name("scan_calibration.json")
# The hypothesis-free direction: the stage's own value (a share α along it is a relative scale
# error, port = (1 + α) oracle, pooled over the cases), banded per stage kind; its floor is one
# rounding of the dtype (a share the size of a class's would be tens of times the tolerance)
VALUE = "the stage's own value"
# DINOv3 ViT-S's block at head_dim 16: a scale that is a power of two, as every real ViT's head_dim
# 64 has, where the test presets' head_dim 8 has not (q * scale is then exact in any dtype)
SHRUNK_DINOV3 = "vit_small_patch16_dinov3 at embed_dim 32, 2 heads, 2 blocks, a 2 x 3 grid"


@dataclass
class Systematic:
    stage: str
    bug: str
    alpha: float
    se: float
    cases: int
    explained: float = 0.0  # the share of the error's sum of squares along the class's difference
    replayed: bool = False  # measured with the port's roundings replayed (``Scan.replay``)

    def fit(self) -> Fit:
        named = self.se <= RESOLVED and abs(self.alpha - 1.0) <= SIGMAS * self.se + FLOOR
        return Fit(self.bug, self.alpha, self.se, float("nan"), named)

    def reason(self, dtype: str, bands: dict | None = None) -> str:
        if self.fit().named:
            what = f"is {self.bug}'s difference (α = {self.alpha:.3f} ± {self.se:.2g})"
            if self.replayed:
                what += f", with fc1's input, output and the activation rounded to {dtype} as the port stores them"
        else:
            key = band_key(self.bug, self.stage)
            lo, hi = band(dtype, key) if bands is None else bands.get(key, (0.0, 0.0))
            along = (
                "runs along the stage's own value: a relative scale error"
                if self.bug == VALUE
                else f"runs along {self.bug}'s difference"
            )
            what = (
                f"{along} (α = {self.alpha:.3g} ± {self.se:.2g}), where correct ports in {dtype} stay within "
                f"{lo:.2g} to {hi:.2g}"
            )
        return f"a systematic error: each element within {dtype}'s tolerance, but pooled over {self.cases} cases the error {what}"


class Scan:
    """The pooled sums per (stage, class), case by case. ``blocks``: the blocks whose stages are
    scanned (None: every block; the model's own stages always): a bug of one operation is in every
    block, and at full size each class evaluated at every block's stage costs more than the
    forward (a ViT-S verify in bfloat16: four times as long)."""

    def __init__(self, blocks: set[int] | None = None):
        # (stage, direction, replayed): Σ e d, Σ d², Σ e², elements, cases
        self.sums: dict[tuple[str, str, bool], np.ndarray] = {}
        self.order: list[str] = []
        self.blocks = blocks  # (a full-size model's scan: its bands are the full-size calibration's)

    def bands(self, dtype: str) -> dict:
        """The correct ports' bands this scan is judged by: the small configs', and for a scan of a
        full-size model (``blocks`` given) each widened to hold those measured at ViT-S and ViT-B
        (``bands_full``): at 197 tokens a correct port's float16 attention weights share 61 % of
        softmax_in_float16's difference (its own output rounding), where the small configs' reach
        11 %; the small configs hold the options (CLIP, SigLIP, DINOv2, BEiT) the full sizes do not."""
        small = calibration().get("bands", {}).get(dtype, {})
        if self.blocks is None:
            return small
        full = calibration().get("bands_full", {}).get(dtype, {})
        return {
            key: (
                min(small.get(key, (0.0, 0.0))[0], full.get(key, (0.0, 0.0))[0]),
                max(small.get(key, (0.0, 0.0))[1], full.get(key, (0.0, 0.0))[1]),
            )
            for key in set(small) | set(full)
        }

    def add(self, out, model, results) -> None:
        """One case: the stages ``results`` (StageResult) say passed locally, where the port's stage
        and its recomputation from the port's inputs have one shape (open_clip's final norm emitted
        for the class token alone, and the pooling that reads it, are judged per element only)."""
        passed = [r.name for r in results if r.ok and r.mode == "local" and r.name in out and self._scanned(r.name)]
        if not passed:
            return
        valid = well_formed(out, model)
        for stage in passed:
            value, bound = model.local(stage, out)
            if np.shape(out[stage]) != np.shape(value):
                continue
            if stage not in self.order:
                self.order.append(stage)
            bound = np.broadcast_to(bound, np.shape(value)) + model.precision.tiny
            port = np.asarray(out[stage], np.float64)
            e = (port - value) / bound
            for bug in classes_for(model.kind(stage), model.config):
                # an overflow's class, where finite (the only cases pooled), is a rounding pattern a
                # correct port can share bit for bit: logits rounded to float16 and scaled after the
                # product are a correct port's own where the scale is a power of two (head_dim 16, 64)
                if bug.family is not None or bug.overflow:
                    continue
                with np.errstate(all="ignore"):
                    alt = _Values(model, out, valid, stage, bug)[stage]
                if alt.shape != e.shape or not np.isfinite(alt).all():
                    continue
                self._pool(stage, bug.name, e, (alt - value) / bound)
            self._pool(stage, VALUE, e, value / bound)
            self.replay(stage, port, out, model, bound)

    def replay(self, stage: str, port, out, model, bound) -> None:
        """The activation classes at a plain MLP's activation, below float32, with the port's
        roundings replayed: fc1's input, weights and output rounded to the dtype, each activation
        of it rounded again (``port``: the stage as emitted, in float64; ``out``: every tap).
        A GELU's input and output in bfloat16 take few distinct values (2⁸ a binade), so each
        output's rounding error is a fixed function of them, the same in every block and case,
        which pooling cannot average away: at ViT-S/16 the tanh GELU measured α = 0.884 ± 0.009
        against the exact GELU computed from fc1's exact output (timm's: 0.885), its rounding at
        those values leaning against the class's difference. Replayed, a port that rounds as it
        is replayed (each framework's eager Linear then activation) shows the class's difference
        bit for bit, or none of it; kept apart (``replayed``), named by the verdict's rule, never
        banded."""
        dtype = model.precision.dtype
        if dtype not in ("bfloat16", "float16") or stored_as(out[stage], dtype) != dtype:
            return
        acts = [b for b in classes_for(model.kind(stage), model.config) if set(b.config) == {"act_layer"}]
        h = model.hidden(stage, out, dtype) if acts else None
        if h is None:
            return
        with np.errstate(all="ignore"):  # float16 past its range: not replayed
            h = rounded(h, dtype)
            base = rounded(activation(model.config.act_layer, h, slope=False)[0], dtype)
            alts = {b.name: rounded(activation(b.config["act_layer"], h, slope=False)[0], dtype) for b in acts}
        if not all(np.isfinite(v).all() for v in (base, *alts.values())):
            return
        e = (port - base) / bound
        for name, alt in alts.items():
            self._pool(stage, name, e, (alt - base) / bound, replayed=True)

    def _scanned(self, stage: str) -> bool:
        return self.blocks is None or not stage.startswith("blocks.") or int(stage.split(".")[1]) in self.blocks

    def _pool(self, stage: str, direction: str, e, d, replayed: bool = False) -> None:
        """One case's sums for the share of the error ``e`` along ``d`` (both over the bound)."""
        sums = self.sums.setdefault((stage, direction, replayed), np.zeros(5))
        sums += (float(np.sum(e * d)), float(np.sum(d * d)), float(np.sum(e * e)), e.size, 1)

    def fits(self) -> list[Systematic]:
        out = []
        for (stage, bug, replayed), (ed, dd, ee, n, cases) in self.sums.items():
            if dd == 0.0:
                continue
            alpha = ed / dd
            scatter = max(ee - 2.0 * alpha * ed + alpha * alpha * dd, 0.0)
            se = float(np.sqrt(scatter / n / dd))
            explained = alpha * ed / ee if ee > 0 else 0.0
            out.append(Systematic(stage, bug, float(alpha), se, int(cases), float(explained), replayed))
        return out

    def systematic(self) -> list[Systematic]:
        """Every significant share (|α| ≥ ALPHA, |α| ≥ SIGNIFICANCE σ_α), in model order: the open
        rule, which the correct ports trip in low precision (measured, not a verdict)."""
        found = [
            f for f in self.fits() if not f.replayed and abs(f.alpha) >= ALPHA and abs(f.alpha) >= SIGNIFICANCE * f.se
        ]
        return sorted(found, key=lambda f: (self.order.index(f.stage), -abs(f.alpha)))

    def named(self) -> list[Systematic]:
        """The verdict's rule: the stages where the pooled error *is* a class's difference (α = 1
        by the diagnosis's rule, σ_α ≤ RESOLVED), in model order, the closest to 1 first."""
        found = [f for f in self.fits() if f.bug != VALUE and f.fit().named]
        return sorted(found, key=lambda f: (self.order.index(f.stage), abs(f.alpha - 1.0)))

    def beyond(self, dtype: str, bands: dict | None = None) -> list[Systematic]:
        """The open rule calibrated per class: each significant share of at least ALPHA (along the
        stage's own value: one rounding of ``dtype``) that lies beyond MARGIN times the correct
        ports' band along it in ``dtype`` (``bands``: the calibration's, or those given), in model
        order, the most of the error explained first."""
        judged_by = self.bands(dtype) if bands is None else bands

        def outside(f: Systematic) -> bool:
            if not banded(f.bug, f.stage) or of_another_dtype(f.bug, dtype):
                return False
            lo, hi = judged_by.get(band_key(f.bug, f.stage), (0.0, 0.0))
            floor = UNIT_ROUNDOFF[dtype] if f.bug == VALUE else ALPHA
            return f.alpha >= max(floor, MARGIN * hi) or f.alpha <= min(-floor, MARGIN * lo)

        found = [f for f in self.fits() if not f.replayed and abs(f.alpha) >= SIGNIFICANCE * f.se and outside(f)]
        return sorted(found, key=lambda f: (self.order.index(f.stage), -f.explained))

    def verdict(self, dtype: str, bands: dict | None = None) -> list[Systematic]:
        """The stages verify calls systematic: a class's difference (``named``) or a share beyond
        the correct ports' band (``beyond``), in model order, the named first at a stage."""
        named = self.named()
        seen = {(f.stage, f.bug) for f in named}
        found = named + [f for f in self.beyond(dtype, bands) if (f.stage, f.bug) not in seen]
        return sorted(found, key=lambda f: self.order.index(f.stage))

    def diagnosis(self, first: Systematic, case: str, dtype: str | None = None) -> Diagnosis:
        """The diagnosis at a systematic stage: the classes named there (two that both fit are
        named together), or, where none is, the shares beyond the band, the most of the error
        explained first (not a name: α is not 1)."""
        fits = [f.fit() for f in self.named() if f.stage == first.stage]
        if fits:
            return Diagnosis(first.stage, case, "pooled", fits[0].bug, fits)
        found = [f.fit() for f in (self.beyond(dtype) if dtype else [first]) if f.stage == first.stage]
        return Diagnosis(first.stage, case, "pooled", None, found or [first.fit()])


@lru_cache(maxsize=1)
def calibration() -> dict:
    return json.loads(CALIBRATION.read_text())


def band(dtype: str, bug: str) -> tuple[float, float]:
    """The lowest and highest significant share the correct ports measured along ``bug`` in
    ``dtype`` (0, 0 where none was significant)."""
    lo, hi = _bands().get(dtype, {}).get(bug, (0.0, 0.0))
    return float(lo), float(hi)


def band_key(bug: str, stage: str) -> str:
    """What a band is kept under: the class, or for the stage's own value the stage's kind."""
    return f"{VALUE} at {stage_kind(stage)}" if bug == VALUE else bug


def banded(bug: str, stage: str | None = None) -> bool:
    """Whether a band can hold ``bug``'s share: not an overflow's class (where finite, its difference
    is a rounding pattern: mlx-image's bfloat16 softmax measured 6.6e3 along the float32 softmax
    without its maximum), nor a LayerNorm's. A LayerNorm's rounding bias
    is its input's rounding against the token's spread (Sheppard's correction), which moves with
    every case: on another seed the correct ports measure -133 along eps 1e-6 in bfloat16 where
    the calibration's seed reached -8 (scan_calibration.json, before the LayerNorm classes were
    left out)."""
    if bug == VALUE:
        return stage is not None and stage_kind(stage) not in NORM_KINDS
    bug = BY_NAME[bug]
    return not bug.overflow and not set(bug.kinds) & set(NORM_KINDS)


def of_another_dtype(bug: str, dtype: str) -> bool:
    """A precision class of another dtype than the run's (the token mean summed in float16, in a
    bfloat16 run): there its difference is that dtype's rounding pattern, which a correct port's
    own rounding of the same values can share, significantly over a wide stage (timm's BEiT in
    bfloat16: α = -1.08 ± 0.08 along token_sum_float16 at its 768-wide pooled mean). Named, it is
    still the verdict's (α = 1); it is no share the open rule reads."""
    return any(bug.endswith(f"_{other}") for other in ("float16", "bfloat16", "float32") if other != dtype)


@lru_cache(maxsize=1)
def _bands() -> dict:
    return calibration().get("bands", {})


def calibrate(
    configs=(
        "vit_test_token",
        "vit_test_token_square",
        "vit_test_avg",
        "vit_test_avg_nocls",
        "vit_test_avg_100_tokens",
        "vit_test_deep",
        "vit_test_registers_avg",
        "vit_test_dynamic",
        "vit_test_siglip",
        "vit_test_clip",
        "vit_test_dinov2",
        "vit_test_beit",
        SHRUNK_DINOV3,
    ),
) -> dict:
    """The correct ports on verify's seeded cases of each config, in every dtype: per dtype the
    largest significant |α| (|α| / σ_α ≥ SIGNIFICANCE), the open rule's alarms (``systematic``),
    the verdict's (``named``: none may exist, each would be a false alarm), the band of the
    significant shares per class (``bands``, seed 0), and the verdict with those bands on held-out
    cases (``held_out``: seed 1, none may exist)."""

    record: dict = {"configs": list(configs), "provenance": collect(), "dtypes": {}, "bands": {}, "replayed": {}}
    for dtype in PORT_DTYPES:
        worst = {"alpha": 0.0, "where": None, "alarms": [], "named": [], "held_out": []}
        bands, replayed = record["bands"].setdefault(dtype, {}), record["replayed"].setdefault(dtype, {})
        for where, scan in _correct_scans(configs, dtype, seed=0):
            for f in scan.fits():
                if f.replayed:  # every share, never banded
                    widen(replayed, f.bug, f.alpha)
                if f.replayed or abs(f.alpha) < SIGNIFICANCE * f.se:
                    continue
                widen(bands, band_key(f.bug, f.stage), f.alpha)
                if abs(f.alpha) > worst["alpha"]:
                    worst.update(alpha=abs(f.alpha), where=f"{where} {f.stage} {f.bug}")
            worst["alarms"] += [f"{where} {f.stage} {f.bug} {f.alpha:.3g}" for f in scan.systematic()]
            worst["named"] += [f"{where} {f.stage} {f.bug} {f.alpha:.3g}" for f in scan.named()]
        for where, scan in _correct_scans(configs, dtype, seed=1):
            worst["held_out"] += [f"{where} {f.stage} {f.bug} {f.alpha:.3g}" for f in scan.verdict(dtype, bands)]
        record["dtypes"][dtype] = worst
        print(dtype, worst, bands, flush=True)
    return record


def widen(bands: dict, key: str, alpha: float) -> None:
    """``bands[key]``, the lowest and highest share (0 included), widened to hold ``alpha``."""
    lo, hi = bands.get(key, (0.0, 0.0))
    bands[key] = (min(lo, float(f"{alpha:.4g}")), max(hi, float(f"{alpha:.4g}")))


def _scan_config(name: str):

    if name == SHRUNK_DINOV3:
        return get_config("vit_small_patch16_dinov3").replace(
            embed_dim=32, num_heads=2, depth=2, img_size=(32, 48), patch_size=16
        )
    return get_config(name)


def _correct_scans(configs, dtype: str, seed: int):
    """(port and config, Scan) of each correct port on verify's cases of each config."""
    for name in configs:
        config = _scan_config(name)
        for port in FRAMEWORK_PORTS:
            scan, make = Scan(), load_factory(port)
            for case, model in seeded_cases(config, seed, dtype):
                if model.beyond_range():
                    continue
                out = make(config, case.state, dtype=dtype)(case.images)
                scan.add(out, model, compare_outputs(out, model, dtype=dtype))
            yield f"{port} {name}", scan
