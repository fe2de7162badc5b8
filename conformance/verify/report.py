"""A verification's report: per stage the worst case, the findings, what was unseen and where each
stage was read; as text, JSON and a plot."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conformance.numerics.tolerances import CHAOTIC
from conformance.report import table
from conformance.sandbox.handed import finding  # noqa: F401 - a report's findings, told by the sandbox
from impls.protocol import ViTConfig
import textwrap
import re

if TYPE_CHECKING:  # the port's process tells findings and imports no comparison
    from conformance.numerics.compare import StageResult


@dataclass
class VerifyReport:
    """What every check's report holds: the port, its config, the cases (and those not judged,
    with why), the findings about the port (``finding``), the case behind each row, the dtype.
    ``kind`` says which check it is; ``located()`` where the port first diverges."""

    port: str
    config: ViTConfig
    failures: list[dict] = field(default_factory=list)
    cases: list[str] = field(default_factory=list)
    worst_case: dict[str, str] = field(default_factory=dict)  # row -> the case behind it
    skipped: list[str] = field(default_factory=list)  # cases outside the dtype's range, and why
    dtype: str = "float32"
    diagnosis: Any = None  # conformance.diagnosis.Diagnosis: the bug class at the first divergence

    kind = ""

    def located(self) -> str | None:
        raise NotImplementedError


@dataclass
class Report(VerifyReport):
    """The forward (a whole model, stage by stage) or an attention port's report."""

    stages: list[StageResult] = field(default_factory=list)  # worst case per stage, model order
    first_divergence: str | None = None
    unseen: dict[str, str] = field(default_factory=dict)  # stage -> why a captured model cannot show it
    sources: dict[str, str] = field(default_factory=dict)  # stage -> where a captured model's tap was read
    attention: dict | None = None  # an attention port's options (then config is unused)
    # a quantized port's: {"what": how, "cost": {stage: row}} (conformance.verify.quantized)
    quantization: dict | None = None
    paths: dict[str, str] = field(default_factory=dict)  # case -> how a compiled model's forward ran on it

    @property
    def kind(self) -> str:
        """What was verified: "forward" (a whole model) or "attention" (an attention port)."""
        return "attention" if self.attention is not None else "forward"

    def located(self) -> str | None:
        """Where the port first diverges: the first divergent stage, or the first finding's stage."""
        return self.first_divergence or (self.failures[0]["stage"] if self.failures else None)

    @property
    def conformant(self) -> bool:
        return not self.failures and all(s.ok for s in self.stages) and bool(self.stages)

    def separation(self, stage: str | None = None) -> float | None:
        """The port's error over the tolerance at ``stage`` (default: the first divergence)."""
        stage = stage or self.first_divergence
        r = next((s for s in self.stages if s.name == stage), None)
        cost = (self.quantization or {}).get("cost", {}).get(stage, {}).get("ratio")
        if cost is not None and (r is None or r.ok):  # a quantized port's weights moved: their cost says how far
            from conformance.verify.quantized import cost_tolerance

            return cost / cost_tolerance()
        if r is None or r.ratio is None:
            return None
        return r.separation

    def to_dict(self) -> dict:
        return {
            "port": self.port,
            "conformant": self.conformant,
            "dtype": self.dtype,
            "first_divergence": self.first_divergence,
            "stages": [s.to_dict() for s in self.stages],
            "failures": self.failures,
            "config": self.attention if self.attention is not None else self.config.to_dict(),
            "cases": self.cases,
            "worst_case": self.worst_case,
            "skipped": self.skipped,
            "checked": len(self.stages),
            "unseen": self.unseen,
            "sources": self.sources,
            "diagnosis": None if self.diagnosis is None else self.diagnosis.to_dict(),
            "quantization": self.quantization,
            "paths": self.paths,
        }


def format_report(report: Report) -> str:

    rows = [[s.name, s.mode, s.max_abs_err, s.ratio, s.tol, s.e2e_ratio, s.e2e_tol, s.ok] for s in report.stages]
    what = (
        f"MultiHeadAttention {report.attention}"
        if report.attention is not None
        else f"{report.config.name or 'config'} {report.config.to_dict()}"
    )
    lines = [
        f"port {report.port} in {report.dtype}: {what}",
        *_quantization_lines(report),
        f"cases: {'; '.join(report.cases)}",
        "each row: the case where the stage is worst; error = max over elements of |port - oracle| over the "
        "error model's bound (docs/tolerances.md), local (from the port's own inputs to the stage) where the "
        "port emits them, and end to end",
        "",
        table(["stage", "checked", "max_abs_err", "error", "tol", "end to end", "tol", "ok"], rows),
        "",
    ]
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
        lines += summarize_stages(
            dict.fromkeys(names, f"seen in {precision} (mixed precision: judged as stored)"), "precision"
        )
    lines += summarize_stages(
        {
            s.name: f"on {report.worst_case.get(s.name, 'its worst case')} the error model's own runs move it by "
            f"at least {CHAOTIC:.0%} of its range: judged end to end by the chaotic tolerance (docs/tolerances.md)"
            for s in report.stages
            if s.chaotic
        },
        "chaotic",
    )
    lines += summarize_stages(report.unseen, "unseen")
    plain = ("output of", "input of", "the model's")  # a module boundary: the usual place, not listed
    lines += summarize_stages(
        {
            k: v
            for k, v in report.sources.items()
            if not v.startswith(plain) or "sequence first" in v or "compiled again" in v
        },
        "read from",
    )
    lines += _path_lines(report.paths)
    for s in report.skipped:
        lines.append(f"not judged: {s}")
    judged = len(report.cases) - len(report.skipped)
    seen = f" ({len(report.unseen)} unseen)" if report.unseen else ""
    if report.conformant:
        lines.append(f"CONFORMANT: all {len(report.stages)} stages checked{seen} within tolerance on {judged} cases")
    else:
        where = report.first_divergence or (report.failures[0]["stage"] if report.failures else "-")
        ratio = report.separation()
        lines.append(
            f"NOT CONFORMANT: first divergent stage {where}"
            + (f" (error {ratio:.3g}x the tolerance)" if ratio and np.isfinite(ratio) else "")
        )
        if report.diagnosis is not None:
            lines.append(f"  {report.diagnosis.line()}")
    return "\n".join(lines)


def _quantization_lines(report: Report) -> list[str]:
    """A quantized port's cost table (the stage table below is its kernels' exactness)."""

    q = report.quantization
    if not q:
        return []
    rows = [[r["stage"], r["rel_error"], r["sqnr_db"], r["cosine"], r["ratio"] or "-"] for r in q["cost"].values()]
    return [
        f"quantized: {q['what']}; the stages below are judged against the oracle on the port's own "
        "weights as its kernels compute with them (kernel exactness, docs/quantization.md)",
        "the quantization's cost, each stage against the float model on its worst case (ratio, where the "
        "stage reads quantized weights: its RMS distance from the float stage, from the same inputs, over "
        "that of noise of each weight's half step):",
        table(["stage", "rel. error", "SQNR dB", "cosine", "ratio"], rows),
        "",
    ]


def summarize_stages(stages: Mapping[str, str], label: str) -> list[str]:
    """One line per reason, blocks folded: 'unseen: blocks.{0..11}.attn.weights: computed inside ...'."""

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


def plot_report(report: Report, path: str | Path, fmt: str | None = None) -> None:
    """The plot, in ``fmt`` (default: the path's suffix, as matplotlib chooses)."""
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
    if report.diagnosis is not None:
        note = textwrap.fill(report.diagnosis.line(), 110)
        ax.text(0.01, 0.98, note, transform=ax.transAxes, va="top", fontsize=7, color="darkred")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120, format=fmt)
    plt.close(fig)


def _path_lines(paths: dict[str, str]) -> list[str]:
    """A compiled model's cases, grouped by how its forward ran on each (never silent: a model past
    dynamo's recompile limit runs eagerly, and its verdict is then the eager model's)."""
    by: dict[str, list[str]] = {}
    for case, path in paths.items():
        by.setdefault(path, []).append(case)
    return [f"ran {path} on {len(cases)} case(s): {'; '.join(cases)}" for path, cases in by.items()]
