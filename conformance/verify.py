"""Verify a port against the float64 oracle on a set of drawn inputs, stage by stage.

    python -m conformance verify pkg.module:make [--preset NAME | --config JSON] [--weights PATH]
                                 [--json PATH] [--plot PATH]

Exit status: 0 the port conforms, 1 it does not, 2 a usage error (bad port spec, config,
weights file). A port that raises, returns the wrong shape or dtype, NaN or Inf, no
``logits``, or a mis-shaped tap is a finding with a one-line reason, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from conformance.compare import StageResult, compare_outputs
from conformance.strategies import IMAGE_KINDS, OFFSET, WeightCase, make_images
from impls import load_factory, tap_names
from impls.config import ViTConfig

class UsageError(Exception):
    """Bad arguments: exit status 2."""


@dataclass
class Case:
    name: str
    images: np.ndarray
    state: dict
    regime: str


def default_cases(config: ViTConfig, state: dict | None = None, seed: int = 0, batch: int = 2) -> list[Case]:
    """Every image kind on the given (or seeded) weights; with seeded weights, also weights at
    4x timm's spread (activations of order 1 to 3, where tanh and exact GELU differ most) and a
    large common offset in every token (where a LayerNorm computing E[x^2] - E[x]^2 fails)."""
    cases = []
    weights = WeightCase(seed, 1.0)
    base = state if state is not None else weights.make(config)
    for i, kind in enumerate(IMAGE_KINDS):
        cases.append(Case(f"{kind} images", make_images(config, batch, kind, seed + i), base, "normal"))
    if state is None:
        for w, label in ((WeightCase(seed + 1, 4.0), "weights x4"), (WeightCase(seed + 2, 4.0, OFFSET), "offset 1000")):
            cases.append(Case(f"ordinary images, {label}", make_images(config, batch, "ordinary", seed), w.make(config),
                              w.regime))
    return cases


@dataclass
class Report:
    port: str
    config: ViTConfig
    stages: list[StageResult] = field(default_factory=list)  # worst case per stage, model order
    failures: list[dict] = field(default_factory=list)
    cases: list[str] = field(default_factory=list)
    first_divergence: str | None = None
    worst_case: dict[str, str] = field(default_factory=dict)  # stage -> the case behind its row

    @property
    def conformant(self) -> bool:
        return not self.failures and all(s.ok for s in self.stages) and bool(self.stages)

    def separation(self, stage: str | None = None) -> float | None:
        """The port's error over the tolerance at ``stage`` (default: the first divergence)."""
        stage = stage or self.first_divergence
        r = next((s for s in self.stages if s.name == stage), None)
        if r is None or r.rel_err is None:
            return None
        return r.rel_err / r.tol

    def to_dict(self) -> dict:
        return {
            "port": self.port,
            "conformant": self.conformant,
            "first_divergence": self.first_divergence,
            "stages": [{k: _finite_or_none(v) for k, v in s.to_dict().items()} for s in self.stages],
            "failures": self.failures,
            "config": self.config.to_dict(),
            "cases": self.cases,
            "worst_case": self.worst_case,
        }


def _finite_or_none(value):
    return None if isinstance(value, float) and not np.isfinite(value) else value


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def verify(make: Callable, config: ViTConfig, *, port: str = "port", state: dict | None = None,
           cases: list[Case] | None = None, seed: int = 0) -> Report:
    from conformance.properties import ModelCase, PropertyFailure, check_deterministic

    cases = default_cases(config, state, seed) if cases is None else cases
    oracle_make = load_factory("numpy")
    report = Report(port, config, cases=[c.name for c in cases])
    names = tap_names(config)
    worst: dict[str, StageResult] = {}
    first_index = len(names)
    for case in cases:
        try:
            forward = make(config, case.state)
        except Exception as e:  # noqa: BLE001 - the port's failure is the finding
            report.failures.append({"case": case.name, "stage": "load", "reason": f"the port raised {_one_line(e)}"})
            continue
        try:
            out = forward(case.images)
        except Exception as e:  # noqa: BLE001
            report.failures.append({"case": case.name, "stage": "forward", "reason": f"the port raised {_one_line(e)}"})
            continue
        if isinstance(out, Mapping):
            unknown = sorted(set(out) - set(names))
            if unknown:
                report.failures.append({"case": case.name, "stage": unknown[0],
                                        "reason": f"unknown tap names {unknown}; known: see impls.tap_names"})
        oracle = oracle_make(config, case.state)(case.images)
        results = compare_outputs(out, oracle, config, batch=case.images.shape[0], regime=case.regime)
        for r in results:
            if not r.ok:
                first_index = min(first_index, names.index(r.name))
                if r.max_abs_err is None or not np.isfinite(r.max_abs_err):
                    report.failures.append({"case": case.name, "stage": r.name, "reason": r.reason})
            prev = worst.get(r.name)
            if prev is None or _badness(r) > _badness(prev):
                worst[r.name] = r
                report.worst_case[r.name] = case.name
    report.stages = [worst[n] for n in names if n in worst]
    if first_index < len(names):
        report.first_divergence = names[first_index]
    if cases and not report.failures:
        try:
            check_deterministic(port, make, ModelCase(config, cases[0].state, cases[0].images, cases[0].regime))
        except PropertyFailure as e:
            report.failures.append({"case": cases[0].name, "stage": e.stage or "logits",
                                    "reason": "two calls on the same input differ (randomness at inference)"})
    return report


def _badness(r: StageResult) -> float:
    if r.rel_err is None:
        return float("inf")
    return r.rel_err / r.tol if r.tol else float("inf")


# ----------------------------------------------------------------------------- output

def format_report(report: Report) -> str:
    from conformance.report import table

    rows = [[s.name, s.max_abs_err, s.rel_err, s.tol, s.ok] for s in report.stages]
    lines = [f"port {report.port}: {report.config.name or 'config'} {report.config.to_dict()}",
             f"cases: {'; '.join(report.cases)}",
             "each row: the case with the largest rel_err / tol; rel_err = max|port - oracle| / max|oracle|", "",
             table(["stage", "max_abs_err", "rel_err", "tol", "ok"], rows), ""]
    for f in report.failures:
        lines.append(f"FAIL {f['stage']} ({f['case']}): {f['reason']}")
    if report.conformant:
        lines.append(f"CONFORMANT: all {len(report.stages)} stages within tolerance on {len(report.cases)} cases")
    else:
        where = report.first_divergence or (report.failures[0]["stage"] if report.failures else "-")
        ratio = report.separation()
        lines.append(f"NOT CONFORMANT: first divergent stage {where}"
                     + (f" (error {ratio:.3g}x the tolerance)" if ratio and np.isfinite(ratio) else ""))
    return "\n".join(lines)


def plot_report(report: Report, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = [s for s in report.stages if s.rel_err is not None and np.isfinite(s.rel_err)]
    x = np.arange(len(stages))
    fig, ax = plt.subplots(figsize=(max(8, 0.18 * len(stages) + 3), 4.5))
    floor = 1e-12
    ax.semilogy(x, [max(s.rel_err, floor) for s in stages], "o-", ms=3, label=f"{report.port} rel_err")
    ax.semilogy(x, [s.tol for s in stages], "--", color="gray", label="tolerance")
    bad = [i for i, s in enumerate(stages) if not s.ok]
    if bad:
        ax.semilogy(bad, [max(stages[i].rel_err, floor) for i in bad], "x", color="red", ms=8, label="over tolerance")
    if report.first_divergence:
        idx = next((i for i, s in enumerate(stages) if s.name == report.first_divergence), None)
        if idx is not None:
            ax.axvline(idx, color="red", alpha=0.3)
    ax.set_xticks(x)
    ax.set_xticklabels([s.name for s in stages], rotation=90, fontsize=6)
    ax.set_ylabel("max|port - oracle| / max|oracle|")
    verdict = "conformant" if report.conformant else f"first divergence: {report.first_divergence}"
    ax.set_title(f"{report.port} against the float64 oracle ({verdict})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load_config(preset: str | None, config_json: str | None, weights: str | None) -> ViTConfig:
    from impls import ConfigError, get_config
    from weights import WeightError, read_config

    try:
        if config_json:
            text = Path(config_json).read_text() if Path(config_json).is_file() else config_json
            return ViTConfig.from_dict(json.loads(text))
        if preset:
            return get_config(preset)
        if weights:
            config = read_config(weights)
            if config is not None:
                return config
        return get_config("vit_test_token")
    except WeightError as e:
        raise UsageError(str(e)) from None
    except (ConfigError, ValueError, TypeError) as e:
        raise UsageError(f"bad config: {e}") from None


def main(args) -> int:
    from weights import WeightError, load_state

    try:
        make = load_factory(args.port)
    except (ImportError, ValueError) as e:
        raise UsageError(f"cannot load port {args.port!r}: {_one_line(e)}") from None
    config = load_config(args.preset, args.config, args.weights)
    state = None
    if args.weights:
        try:
            state = load_state(args.weights, config)
        except WeightError as e:
            raise UsageError(str(e)) from None
    report = verify(make, config, port=args.port, state=state, seed=args.seed)
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1, allow_nan=False) + "\n")
    if args.plot:
        plot_report(report, args.plot)
    return 0 if report.conformant else 1


# ----------------------------------------------------------------------------- attention

ATTENTION_STAGES = ("attn.weights", "attn")


def attention_cases(seed: int = 0):
    """Cross-attention (Nq=5, Nk=7, context width 6) with no mask, a boolean keep-mask, an
    additive mask, a mask with a fully masked query row, and inputs large enough that the
    logits reach the hundreds."""
    from conformance.properties import AttentionCase
    from weights import init_params, mha_shapes

    options = dict(dim=8, context_dim=6, num_heads=2, head_dim=4, qkv_bias=True)
    state = init_params(mha_shapes(**options), seed=seed, scale=16.0)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, 5, 8)).astype(np.float32)
    ctx = rng.normal(size=(2, 7, 6)).astype(np.float32)
    keep = rng.random((2, 1, 5, 7)) < 0.6
    keep[..., 0] = True
    dead = keep.copy()
    dead[:, :, 2] = False
    masks = {"no mask": None, "boolean mask": keep, "additive mask": np.where(keep, rng.normal(0, 2, keep.shape),
                                                                              -np.inf).astype(np.float32),
             "fully masked row": dead}
    cases = [(name, AttentionCase(options, state, x, ctx), mask) for name, mask in masks.items()]
    # Logits in the hundreds: where a softmax that does not subtract the row maximum overflows.
    cases.append(("large logits", AttentionCase(options, state, x * 30, ctx * 30, "stress"), None))
    return cases


def verify_attention(make_attention: Callable, *, port: str = "attention port", seed: int = 0) -> Report:
    """An attention factory against the oracle's MultiHeadAttention, per mask case."""
    from conformance.compare import compare_array
    from conformance.tolerances import tolerance
    from impls.config import get_config

    cases = attention_cases(seed)
    report = Report(port, get_config("vit_test_token"), cases=[c[0] for c in cases])
    oracle = load_factory("impls.numpy_vit:make_attention")
    worst: dict[str, StageResult] = {}
    first = len(ATTENTION_STAGES)
    for name, case, mask in cases:
        try:
            out, weights = make_attention(case.state, **case.options)(case.x, case.context, mask)
        except Exception as e:  # noqa: BLE001
            report.failures.append({"case": name, "stage": "forward", "reason": f"the port raised {_one_line(e)}"})
            continue
        ref, ref_w = oracle(case.state, **case.options)(case.x, case.context, mask)
        results = [compare_array("attn", out, ref, tolerance("attn", regime=case.regime))]
        if weights is not None:
            results.insert(0, compare_array("attn.weights", weights, ref_w, tolerance("attn.weights", regime=case.regime)))
        for r in results:
            if not r.ok:
                first = min(first, ATTENTION_STAGES.index(r.name))
            if r.name not in worst or _badness(r) > _badness(worst[r.name]):
                worst[r.name] = r
                report.worst_case[r.name] = name
    report.stages = [worst[n] for n in ATTENTION_STAGES if n in worst]
    report.first_divergence = ATTENTION_STAGES[first] if first < len(ATTENTION_STAGES) else None
    return report
