"""Verify a port against the float64 oracle on a set of drawn inputs, stage by stage.

    python -m conformance verify pkg.module:make [--preset NAME | --config JSON] [--weights PATH]
                                 [--dtype float32|bfloat16|float16] [--json PATH] [--plot PATH]

Exit status: 0 the port conforms, 1 it does not, 2 a usage error (bad port spec, config,
weights file), 3 the tool's own failure (an exception inside the mapping, capture, error model
or comparison: its last frames and a line saying so, never "the port raised"). The oracle runs first, and the port gets read-only copies of the images and
the state: a port that raises, writes to its inputs, changes the state it was handed, returns
the wrong shape or dtype, NaN or Inf, no ``logits``, or a mis-shaped tap is a finding with a
one-line reason, never a traceback. Batches of 3 and 1 images are used.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from conformance.compare import StageResult, compare_outputs
from conformance.report import ToolError, describe_exception
from conformance.error_model import CaseModel
from conformance.support import Unsupported
from conformance.strategies import IMAGE_KINDS, OFFSET, TrainedLike, WeightCase, make_images, with_block0_logit
from impls import load_factory, tap_names
from impls.config import ViTConfig

BATCHES = (3, 1)  # 1 catches a port that squeezes the batch; 1 and 3 one that assumes 2


class UsageError(Exception):
    """Bad arguments: exit status 2."""


@dataclass
class Case:
    name: str
    images: np.ndarray
    state: dict


def default_cases(config: ViTConfig, state: dict | None = None, seed: int = 0) -> list[Case]:
    """Every image kind on the given (or seeded) weights, in batches of 3 and 1; with seeded
    weights also weights at 4x timm's spread (activations of order 1 to 3, where tanh and exact
    GELU differ most), a large common offset in every token (where a LayerNorm computing
    E[x^2] - E[x]^2 fails), 64x (saturated softmax) and trained-like weights (massive
    activations, attention logits in the hundreds: where a softmax without its max overflows;
    and logits in the tens of thousands, below float16's 65504 only if q is scaled before q kᵀ)."""
    cases = []
    base = state if state is not None else WeightCase(seed, 1.0).make(config)
    for i, kind in enumerate(IMAGE_KINDS):
        batch = BATCHES[i % len(BATCHES)]
        cases.append(Case(f"{kind} images (batch {batch})", make_images(config, batch, kind, seed + i), base))
    if state is None:
        for i, (w, label) in enumerate(((WeightCase(seed + 1, 4.0), "weights x4"),
                                        (WeightCase(seed + 2, 4.0, OFFSET), "offset 1000"),
                                        (WeightCase(seed + 3, 64.0), "weights x64"),
                                        (TrainedLike(seed + 4), "trained-like weights"))):
            batch = BATCHES[i % len(BATCHES)]
            cases.append(Case(f"ordinary images (batch {batch}), {label}",
                              make_images(config, batch, "ordinary", seed), w.make(config)))
        images = make_images(config, 3, "ordinary", seed)
        cases.append(Case("ordinary images (batch 3), trained-like weights, block 0 logits to 3e4", images,
                          with_block0_logit(config, TrainedLike(seed + 4).make(config), images, 3e4)))
    if config.dynamic_img_size:  # the position embedding resampled up and down at run time
        gh, gw = config.grid_size
        for grid in ((gh + 2, gw + 1), (max(1, gh // 2), max(1, gw - 1))):
            cases.append(Case(f"ordinary images (batch 2) on a {grid[0]}x{grid[1]} patch grid",
                              make_images(config, 2, "ordinary", seed + 5, grid), base))
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
    dtype: str = "float32"
    skipped: list[str] = field(default_factory=list)  # cases outside the dtype's range, and why
    unseen: dict[str, str] = field(default_factory=dict)  # stage -> why a captured model cannot show it
    sources: dict[str, str] = field(default_factory=dict)  # stage -> where a captured model's tap was read
    attention: dict | None = None  # an attention port's options (then config is unused)

    @property
    def conformant(self) -> bool:
        return not self.failures and all(s.ok for s in self.stages) and bool(self.stages)

    def separation(self, stage: str | None = None) -> float | None:
        """The port's error over the tolerance at ``stage`` (default: the first divergence)."""
        stage = stage or self.first_divergence
        r = next((s for s in self.stages if s.name == stage), None)
        if r is None or r.ratio is None:
            return None
        return r.separation

    def to_dict(self) -> dict:
        return {
            "port": self.port,
            "conformant": self.conformant,
            "dtype": self.dtype,
            "first_divergence": self.first_divergence,
            "stages": [{k: _finite_or_none(v) for k, v in s.to_dict().items()} for s in self.stages],
            "failures": self.failures,
            "config": self.attention if self.attention is not None else self.config.to_dict(),
            "cases": self.cases,
            "worst_case": self.worst_case,
            "skipped": self.skipped,
            "checked": len(self.stages),
            "unseen": self.unseen,
            "sources": self.sources,
        }


def _finite_or_none(value):
    return None if isinstance(value, float) and not np.isfinite(value) else value


def _read_only(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


def state_changes(handed: Mapping, original: Mapping) -> list[str]:
    """What a port did to the state dict it was handed: keys removed, added or replaced."""
    changes = [f"removed {k!r}" for k in sorted(original) if k not in handed]
    changes += [f"added {k!r}" for k in sorted(handed) if k not in original]
    changes += [f"replaced {k!r}" for k in sorted(original) if k in handed and not (
        isinstance(handed[k], np.ndarray) and handed[k].shape == original[k].shape
        and np.array_equal(handed[k], original[k]))]
    return changes


def _finding(report: Report, case: str, stage: str, reason: str) -> None:
    finding = {"case": case, "stage": stage, "reason": reason}
    if finding not in report.failures:  # a second pass repeats what the first found
        report.failures.append(finding)


@lru_cache(maxsize=8)
def _seeded_cases(config: ViTConfig, seed: int, dtype: str) -> tuple[tuple[Case, CaseModel], ...]:
    """The default cases on seeded weights and their error models, built once per config, seed
    and dtype (the zoo verifies 28 ports on the same ones); their arrays are read-only."""
    out = []
    for case in default_cases(config, None, seed):
        case = Case(case.name, _read_only(case.images), {k: _read_only(v) for k, v in case.state.items()})
        out.append((case, CaseModel(config, case.state, case.images, dtype)))
    return tuple(out)


def verify(make: Callable, config: ViTConfig, *, port: str = "port", state: dict | None = None,
           cases: list[Case] | None = None, seed: int = 0, dtype: str = "float32", policy: str = "mixed") -> Report:
    from conformance.properties import ModelCase, PropertyFailure, build, check_deterministic

    from conformance.support import check_supported, supports_of

    check_supported(supports_of(make), config)  # Unsupported names the option
    if cases is None and state is None:
        pairs = list(_seeded_cases(config, seed, dtype))
    else:
        cases = default_cases(config, state, seed) if cases is None else cases
        pairs = [(case, None) for case in cases]
    cases = [case for case, _ in pairs]
    report = Report(port, config, cases=[c.name for c in cases], dtype=dtype)
    names = tap_names(config)
    worst: dict[str, StageResult] = {}
    first_index = len(names)
    judged: list[Case] = []
    for case, model in pairs:
        model = model or CaseModel(config, case.state, case.images, dtype)  # the oracle runs first
        beyond = model.beyond_range()
        if beyond:  # no port can represent this case in the dtype: judging it would be a false alarm
            report.skipped.append(f"{case.name}: {beyond}")
            continue
        judged.append(case)
        handed = {k: _read_only(v) for k, v in case.state.items()}
        images = _read_only(case.images)
        try:
            forward = build(make, config, handed, dtype)
        except (Unsupported, ToolError):
            raise
        except Exception as e:  # noqa: BLE001 - the port's failure is the finding
            _finding(report, case.name, "load", f"the port raised {describe_exception(e)}")
            continue
        changed = state_changes(handed, case.state)
        if changed:
            _finding(report, case.name, "load", f"the port changed the state it was handed: {', '.join(changed[:4])}")
            continue
        try:
            out = forward(images)
        except ToolError:
            raise
        except Exception as e:  # noqa: BLE001
            wrote = isinstance(e, ValueError) and "read-only" in str(e)
            _finding(report, case.name, "forward", ("the port wrote to its inputs, which verify hands read-only: "
                                                    if wrote else "the port raised ") + describe_exception(e))
            continue
        if not np.array_equal(images, case.images) or state_changes(handed, case.state):
            _finding(report, case.name, "forward", "the port wrote to its inputs (images or state) during forward")
            continue
        if isinstance(out, Mapping):
            unknown = sorted(set(out) - set(names))
            if unknown:
                _finding(report, case.name, unknown[0], f"unknown tap names {unknown}; known: see impls.tap_names")
        report.unseen.update(getattr(out, "unseen", {}))
        report.sources.update(getattr(out, "sources", {}))
        for stage, reason in getattr(out, "findings", ()):
            if not any(f["stage"] == stage and f["reason"] == reason for f in report.failures):
                _finding(report, case.name, stage, reason)
            if stage in names:
                first_index = min(first_index, names.index(stage))
        second = getattr(out, "second", None)  # a second pass off the model's own path: judged too
        results = compare_outputs(out.own_pass() if second is not None else out, model, dtype=dtype, policy=policy)
        if second is not None:
            results += [r for r in compare_outputs(second, model, dtype=dtype, policy=policy)
                        if r.name != "logits" or "logits" in second]
        for r in results:
            if not r.ok:
                first_index = min(first_index, names.index(r.name))
                if r.ratio is None or not np.isfinite(r.ratio):
                    _finding(report, case.name, r.name, r.reason)
            prev = worst.get(r.name)
            if prev is None or r.separation > prev.separation:
                worst[r.name] = r
                report.worst_case[r.name] = case.name
    report.stages = [worst[n] for n in names if n in worst]
    for n in report.unseen:
        report.sources.pop(n, None)
    if first_index < len(names):
        report.first_divergence = names[first_index]
    elif report.failures:
        report.first_divergence = report.failures[0]["stage"]  # load or forward: before any stage
    if judged and not report.failures:
        try:
            check_deterministic(port, make, ModelCase(config, judged[0].state, judged[0].images, dtype=dtype))
        except PropertyFailure as e:
            _finding(report, judged[0].name, e.stage or "logits", "two calls on the same input differ (randomness at "
                                                                 "inference)")
    return report


# ----------------------------------------------------------------------------- output

def format_report(report: Report) -> str:
    from conformance.report import table

    rows = [[s.name, s.mode, s.max_abs_err, s.ratio, s.tol, s.e2e_ratio, s.e2e_tol, s.ok] for s in report.stages]
    what = (f"MultiHeadAttention {report.attention}" if report.attention is not None else
            f"{report.config.name or 'config'} {report.config.to_dict()}")
    lines = [f"port {report.port} in {report.dtype}: {what}",
             f"cases: {'; '.join(report.cases)}",
             "each row: the case where the stage is worst; error = max over elements of |port - oracle| over the "
             "error model's bound (docs/tolerances.md), local (from the port's own inputs to the stage) where the "
             "port emits them, and end to end", "",
             table(["stage", "checked", "max_abs_err", "error", "tol", "end to end", "tol", "ok"], rows), ""]
    folded: dict[tuple[str, str], list[str]] = {}
    for f in report.failures:  # one line per finding, its cases folded
        folded.setdefault((f["stage"], f["reason"]), []).append(f["case"])
    for (stage, reason), cases in folded.items():
        more = f"; and {len(cases) - 1} more case(s)" if len(cases) > 1 else ""
        lines.append(f"FAIL {stage} ({cases[0]}{more}): {reason}")
    parts = {s.name: s.tokens for s in report.stages if s.tokens}
    lines += summarize_stages(parts, "compared on")
    stored = {}
    for s in report.stages:
        if s.stored and s.stored != report.dtype:
            stored.setdefault(s.stored, []).append(s.name)
    for precision, names in stored.items():
        lines += summarize_stages(dict.fromkeys(names, f"seen in {precision} (mixed precision: judged as stored)"),
                                  "precision")
    lines += summarize_stages(report.unseen, "unseen")
    lines += summarize_stages({k: v for k, v in report.sources.items() if not v.startswith(("output of", "input of",
                                                                                             "the model's"))}, "read from")
    for s in report.skipped:
        lines.append(f"not judged: {s}")
    judged = len(report.cases) - len(report.skipped)
    seen = f" ({len(report.unseen)} unseen)" if report.unseen else ""
    if report.conformant:
        lines.append(f"CONFORMANT: all {len(report.stages)} stages checked{seen} within tolerance on {judged} cases")
    else:
        where = report.first_divergence or (report.failures[0]["stage"] if report.failures else "-")
        ratio = report.separation()
        lines.append(f"NOT CONFORMANT: first divergent stage {where}"
                     + (f" (error {ratio:.3g}x the tolerance)" if ratio and np.isfinite(ratio) else ""))
    return "\n".join(lines)


def summarize_stages(stages: Mapping[str, str], label: str) -> list[str]:
    """One line per reason, blocks folded: 'unseen: blocks.{0..11}.attn.weights: computed inside ...'."""
    import re

    patterns: dict[tuple[str, str], list[str]] = {}
    for stage, reason in stages.items():
        m = re.match(r"blocks\.(\d+)\.?(.*)", stage)
        key = (f"blocks.{{i}}.{m.group(2)}".rstrip(".") if m else stage, reason)
        patterns.setdefault(key, []).append(m.group(1) if m else "")
    by_reason: dict[str, list[str]] = {}
    for (pattern, reason), blocks in patterns.items():
        where = pattern.replace("{i}", blocks[0] if len(blocks) == 1 else f"{{{blocks[0]}..{blocks[-1]}}}")
        by_reason.setdefault(reason, []).append(where)
    return [f"{label}: {', '.join(wheres)}: {reason}" for reason, wheres in by_reason.items()]


def plot_report(report: Report, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = [s for s in report.stages if s.ratio is not None and np.isfinite(s.ratio)]
    x = np.arange(len(stages))
    fig, ax = plt.subplots(figsize=(max(8, 0.18 * len(stages) + 3), 4.5))
    floor = 1e-3
    sep = [max(s.separation, floor) for s in stages]
    ax.semilogy(x, sep, "o-", ms=3, label=f"{report.port}: error / tolerance")
    ax.axhline(1.0, ls="--", color="gray", label="tolerance")
    bad = [i for i, s in enumerate(stages) if not s.ok]
    if bad:
        ax.semilogy(bad, [sep[i] for i in bad], "x", color="red", ms=8, label="over tolerance")
    if report.first_divergence:
        idx = next((i for i, s in enumerate(stages) if s.name == report.first_divergence), None)
        if idx is not None:
            ax.axvline(idx, color="red", alpha=0.3)
    ax.set_xticks(x)
    ax.set_xticklabels([s.name for s in stages], rotation=90, fontsize=6)
    ax.set_ylabel("error over the error model's bound, / tolerance")
    verdict = "conformant" if report.conformant else f"first divergence: {report.first_divergence}"
    ax.set_title(f"{report.port} ({report.dtype}) against the float64 oracle ({verdict})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


DEFAULT_CONFIGS = ("vit_test_token", "vit_test_token_square")


def default_config(make=None) -> ViTConfig:
    """vit_test_token, or the first of its twins the port supports (its square twin for a port of
    square images only), or vit_test_token moved inside what the port declares; failing all,
    vit_test_token (verify then names the option the port refuses)."""
    from conformance.support import build_config, supports_of, unsupported_option
    from impls import get_config

    supports = supports_of(make) if make is not None else None
    for name in DEFAULT_CONFIGS:
        if unsupported_option(supports, get_config(name)) is None:
            return get_config(name)
    base = get_config(DEFAULT_CONFIGS[0])
    fitted = build_config(supports, {f: getattr(base, f) for f in base.__dataclass_fields__ if f != "name"})
    return fitted if fitted is not None else base


def with_settings(config: ViTConfig, settings: list[str]) -> ViTConfig:
    """``--set key=value`` applied to a config (a value is JSON, else a string): the field is named
    in any error."""
    from impls import ConfigError

    changes = {}
    for item in settings:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set {item!r} must look like KEY=VALUE (e.g. depth=2, num_classes=0)")
        if key not in config.__dataclass_fields__ or key == "name":
            raise UsageError(f"--set {key}: not a config field; fields: {', '.join(f for f in config.__dataclass_fields__ if f != 'name')}")
        try:
            changes[key] = json.loads(raw)
        except ValueError:
            changes[key] = raw
    if not changes:
        return config
    try:
        return ViTConfig.from_dict({**config.to_dict(), **changes})
    except (ConfigError, ValueError, TypeError) as e:
        raise UsageError(f"--set {', '.join(f'{k}={v!r}' for k, v in changes.items())}: {e}") from None


def load_config(preset: str | None, config_json: str | None, weights: str | None, make=None,
                settings: list[str] | None = None) -> ViTConfig:
    from impls import ConfigError, get_config
    from weights import WeightError, read_config

    try:
        config = None
        if config_json:
            # Inline JSON or a file: a long inline config is not a path to probe (ENAMETOOLONG).
            text = config_json if config_json.lstrip().startswith("{") else Path(config_json).read_text()
            config = ViTConfig.from_dict(json.loads(text))
        elif preset:
            config = get_config(preset)
        elif weights:
            config = read_config(weights)
        if config is None:
            config = default_config(make)
        return with_settings(config, settings or [])
    except WeightError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot read the config file {config_json!r}: {e.strerror}") from None
    except (ConfigError, ValueError, TypeError) as e:
        raise UsageError(f"bad config: {e}") from None


def _load(spec: str, what: str):
    try:
        return load_factory(spec)
    except Exception as e:  # noqa: BLE001 - a module that does not import or parse is a usage error
        raise UsageError(f"cannot load {what} {spec!r}: {describe_exception(e)}") from None


def _with_taps(make, taps: list[str]):
    if not taps:
        return make
    from conformance.capture import ModelPort

    if not isinstance(make, ModelPort):
        raise UsageError("--tap applies to a ModelPort (a model and its weight mapping), not a port factory: a factory "
                         "names its taps itself")
    overrides = {}
    for t in taps:
        stage, sep, module = t.partition("=")
        if not sep or not stage or not module:
            raise UsageError(f"--tap {t!r} must look like STAGE=MODULE or STAGE=MODULE:in")
        overrides[stage] = module
    return make.with_taps(overrides)


def _write(report: Report, args) -> None:
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1, allow_nan=False) + "\n")
    if args.plot:
        plot_report(report, args.plot)


def main(args) -> int:
    from conformance.support import Unsupported

    if args.attention:
        if args.port:
            raise UsageError("give a whole-model port or --attention, not both")
        report = verify_attention(_load(args.attention, "attention factory"), port=args.attention, seed=args.seed)
        _write(report, args)
        return 0 if report.conformant else 1
    if args.grad:
        return _main_grad(args)
    if not args.port:
        raise UsageError("name the port to verify (pkg.module:name), or --attention pkg.module:make_attention")
    make = _with_taps(_load(args.port, "port"), args.tap)
    config, state = _config_and_state(args, make)
    try:
        report = verify(make, config, port=args.port, state=state, seed=args.seed, dtype=args.dtype,
                        policy=getattr(args, "policy", "mixed"))
    except (Unsupported, ValueError) as e:
        if isinstance(e, Unsupported) or "tap override" in str(e):
            raise UsageError(str(e)) from None
        raise
    _write(report, args)
    return 0 if report.conformant else 1


def _config_and_state(args, make=None) -> tuple[ViTConfig, dict | None]:
    """--preset / --config / the config stored in --weights (or the default that fits the port),
    with --set applied, and --weights' state (or None)."""
    from weights import WeightError, load_state

    config = load_config(args.preset, args.config, args.weights, make, getattr(args, "set", None))
    if not args.weights:
        return config, None
    try:
        return config, load_state(args.weights, config)
    except WeightError as e:
        raise UsageError(str(e)) from None


def _main_grad(args) -> int:
    from conformance.gradients import check_grad_dtype
    from conformance.support import Unsupported
    from conformance.verify_grad import format_grad_report, load_grad_factory, verify_grad

    if args.port or args.attention:
        raise UsageError("give a gradient factory (--grad) alone, without a forward port or --attention")

    try:
        check_grad_dtype(args.dtype)
    except ValueError as e:
        raise UsageError(f"{e} (docs/gradients.md)") from None
    try:
        make_grad = load_grad_factory(args.grad)
    except (ImportError, ValueError) as e:
        raise UsageError(f"cannot load gradient factory {args.grad!r}: {describe_exception(e)}") from None
    config, state = _config_and_state(args)
    try:
        report = verify_grad(make_grad, config, port=args.grad, state=state, seed=args.seed, dtype=args.dtype)
    except Unsupported as e:
        raise UsageError(str(e)) from None
    print(format_grad_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1, allow_nan=False) + "\n")
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
    cases.append(("large logits", AttentionCase(options, state, x * 30, ctx * 30), None))
    return cases


def verify_attention(make_attention: Callable, *, port: str = "attention port", seed: int = 0) -> Report:
    """An attention factory against the oracle's MultiHeadAttention, per mask case, end to end
    (the port emits no q, k, v), on read-only inputs."""
    from conformance.compare import compare_stage
    from impls.config import get_config

    cases = attention_cases(seed)
    report = Report(port, get_config("vit_test_token"), cases=[c[0] for c in cases], attention=dict(cases[0][1].options))
    worst: dict[str, StageResult] = {}
    first = len(ATTENTION_STAGES)
    for name, case, mask in cases:
        model = case.error_model(mask=mask)  # the oracle runs first
        x, ctx = _read_only(case.x), _read_only(case.context)
        try:
            out, weights = make_attention({k: _read_only(v) for k, v in case.state.items()}, **case.options)(x, ctx,
                                                                                                            mask)
        except Exception as e:  # noqa: BLE001
            _finding(report, name, "forward", f"the port raised {describe_exception(e)}")
            continue
        if not (np.array_equal(x, case.x) and np.array_equal(ctx, case.context)):
            _finding(report, name, "forward", "the port wrote to its inputs")
            continue
        results = [compare_stage("attn", out, model, {})]
        if weights is not None:
            results.insert(0, compare_stage("attn.weights", weights, model, {}))
        for r in results:
            if not r.ok:
                first = min(first, ATTENTION_STAGES.index(r.name))
            if r.name not in worst or r.separation > worst[r.name].separation:
                worst[r.name] = r
                report.worst_case[r.name] = name
    report.stages = [worst[n] for n in ATTENTION_STAGES if n in worst]
    report.first_divergence = ATTENTION_STAGES[first] if first < len(ATTENTION_STAGES) else None
    return report
