"""python -m conformance zoo: run every mutant through the front door and report.

Each mutant goes through ``verify`` (the same code as ``python -m conformance verify``) for
its first divergent stage and separation ratio, and through one ``pytest --port`` /
``--attention-port`` run of a sample of the property suite (the plugin path a user takes),
for the tests that catch it. The correct ports, wrapped as user ports, run the same sample.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from conformance.numerics.precision import PORT_DTYPES
from conformance.report import table
from conformance.verify import verify, verify_attention
from conformance.verify.grad import verify_grad
from conformance.zoo.catalogue import MAIN_GRADIENT_TEST, MUTANTS, Mutant
from impls import get_config, load_factory
import importlib.util

CORRECT_MODEL = ("impls.torch_vit:make", "impls.mlx_vit:make", "impls.jax_vit:make")
CORRECT_ATTENTION = ("impls.torch_vit:make_attention", "impls.mlx_vit:make_attention", "impls.jax_vit:make_attention")
CORRECT_SAMPLE_MODEL = ("test_every_tap_of_every_port_matches_the_oracle",)
CORRECT_SAMPLE_ATTENTION = ("test_masked_keys_do_not_influence_the_output",)
CORRECT_GRADIENT = ("impls.torch_vit:make_grad", "impls.mlx_vit:make_grad", "impls.jax_vit:make_grad")
CORRECT_SAMPLE_GRADIENT = MAIN_GRADIENT_TEST


@dataclass
class ZooRow:
    name: str
    framework: str
    level: str
    declared: str
    found: str | None
    ratio: float | None
    exposing_case: str | None
    caught_by: list[str] = field(default_factory=list)
    sampled: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)  # sampled tests that did not fail on it
    description: str = ""
    source: str = ""
    dtype: str = "float32"
    by_dtype: dict = field(default_factory=dict)  # dtype -> {"found", "ratio", "case", "named"} (model mutants)
    named: str | None = None  # the bug class verify's diagnosis names, in the mutant's dtype
    bug_class: str = ""  # the class it declares

    @property
    def located(self) -> bool:
        return self.found == self.declared

    @property
    def caught(self) -> bool:
        return bool(self.caught_by) and not self.missed


def verify_mutant(mutant: Mutant, dtype: str | None = None):
    make = load_factory(mutant.factory)
    if mutant.level == "gradient":
        return verify_grad(make, get_config(mutant.config), port=mutant.name)
    if mutant.level == "attention":
        return verify_attention(make, port=mutant.name)
    return verify(make, get_config(mutant.config), port=mutant.name, dtype=dtype or mutant.dtype)


def named(report) -> str | None:
    """The bug class a report's diagnosis names (None: none, or no diagnosis)."""
    return None if report.diagnosis is None else report.diagnosis.named


def _test_files() -> dict[str, Path]:
    """Test function name -> the installed file that defines it."""

    # where the shipped suite is installed, found without importing it (library code imports no test module)
    suite = Path(importlib.util.find_spec("conformance").submodule_search_locations[0]) / "tests"
    files = {}
    for path in sorted(suite.glob("test_*.py")):
        for match in re.finditer(r"^def (test_\w+)\(", path.read_text(), re.M):
            files[match.group(1)] = path
    return files


def run_plugin(
    selection: list[tuple[str, str, str]], workers: int = 2, profile: str = "zoo", dtype: str = "float32"
) -> dict:
    """One pytest run, as a user runs it (``--port`` / ``--attention-port``), of the given (test,
    port spec, level) triples; returns {(test, spec): "passed" | "failed" | ...}. The mutants are
    this project's own code, run in pytest's process (``--in-process-ports``): what the zoo
    proves is the properties' catch, and a process per mutant (its framework imported in each)
    would cost most of the run; the isolation of given ports has its own tests."""
    files = _test_files()
    unknown = sorted({t for t, _, _ in selection if t not in files})
    if unknown:
        raise ValueError(f"no such tests in conformance/tests: {unknown}")
    model = sorted({spec for _, spec, level in selection if level in ("model", "packed", "quantized")})
    attention = sorted({spec for _, spec, level in selection if level == "attention"})
    gradient = sorted({spec for _, spec, level in selection if level == "gradient"})
    with tempfile.TemporaryDirectory() as tmp:
        junit = os.path.join(tmp, "zoo.xml")
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "--only-given-ports",
            "--in-process-ports",
            "-q",
            # The outcomes are read from the JUnit XML: a line per failure, where a full traceback
            # (pytest parses each frame's source) costs more than the failing test did.
            "--tb=line",
            "-p",
            "no:cacheprovider",
            "-p",
            "conformance.quick_exit",  # the JUnit XML is all the zoo reads: no teardown after it
            f"--hypothesis-profile={profile}",
            f"--junitxml={junit}",
            f"--rootdir={files[selection[0][0]].parent}",
            f"--dtype={dtype}",
        ]
        if workers > 1:
            cmd += ["-n", str(workers)]
        cmd += [arg for spec in model for arg in ("--port", spec)]
        cmd += [arg for spec in attention for arg in ("--attention-port", spec)]
        cmd += [arg for spec in gradient for arg in ("--grad-port", spec)]
        cmd += [f"{files[test]}::{test}[{spec}]" for test, spec, _ in selection]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if not os.path.exists(junit):
            raise RuntimeError(
                f"pytest did not run (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        outcome = {(test, spec): "not run" for test, spec, _ in selection}
        for case in ET.parse(junit).getroot().iter("testcase"):
            test, _, params = case.get("name", "").partition("[")
            key = (test, params.rstrip("]"))
            if key in outcome:
                failed = case.find("failure") is not None or case.find("error") is not None
                skipped = case.find("skipped") is not None
                outcome[key] = "failed" if failed else "skipped" if skipped else "passed"
        return outcome


def run_zoo(
    mutants=None,
    with_plugin: bool = True,
    workers: int = 2,
    with_verify: bool = True,
    all_dtypes: bool = False,
    correct_ports: tuple[str, ...] = CORRECT_MODEL + CORRECT_ATTENTION + CORRECT_GRADIENT,
) -> tuple[list[ZooRow], dict]:
    """``all_dtypes``: also verify every model mutant in the other dtypes, to show where each
    bug can be seen and where it sinks below the dtype's own roundoff. ``correct_ports``: the
    built-in ports wrapped as user ports that run beside the mutants (they must pass)."""
    mutants = list(MUTANTS.values()) if mutants is None else list(mutants)
    rows = []
    for m in mutants:
        row = ZooRow(
            m.name,
            m.framework,
            m.level,
            m.first_divergence,
            None,
            None,
            None,
            description=m.description,
            source=m.source,
            dtype=m.dtype,
            bug_class=m.bug_class,
        )
        if with_verify:
            report = verify_mutant(m)
            row.named = named(report)
            row.found = report.located()
            row.ratio = report.separation(row.found) if row.found else None
            row.exposing_case = report.worst_case.get(row.found or "") or next(
                (f["case"] for f in report.failures if f["stage"] == row.found), None
            )
            if all_dtypes and m.level in ("model", "packed", "quantized"):  # gradients: float32 only
                for dtype in PORT_DTYPES:
                    r = report if dtype == m.dtype else verify_mutant(m, dtype)
                    found = r.located()
                    row.by_dtype[dtype] = {
                        "found": found,
                        "ratio": r.separation(found) if found else None,
                        "case": r.worst_case.get(found or ""),
                        "named": named(r),
                        "pooled": None
                        if r.diagnosis is None or r.diagnosis.mode != "pooled"
                        else r.diagnosis.fits[0].alpha,
                    }
        rows.append(row)
    correct: dict = {}
    if with_plugin:
        # One pytest run per dtype: the precision mutants run where their bug bites. The correct
        # ports, wrapped as user ports, run the main tests in float32 here; the main suite runs
        # them (as built-ins) through every sampled test, and in bf16 and fp16.
        for dtype in sorted({m.dtype for m in mutants} | {"float32"}):
            group = [m for m in mutants if m.dtype == dtype]
            selection = [(test, m.factory, m.level) for m in group for test in m.sample]
            if dtype == "float32":
                for level, specs, tests in (
                    ("model", CORRECT_MODEL, CORRECT_SAMPLE_MODEL),
                    ("attention", CORRECT_ATTENTION, CORRECT_SAMPLE_ATTENTION),
                    ("gradient", CORRECT_GRADIENT, CORRECT_SAMPLE_GRADIENT),
                ):
                    selection += [(test, spec, level) for spec in specs if spec in correct_ports for test in tests]
            if not selection:
                continue
            outcome = run_plugin(selection, workers, dtype=dtype)
            for row, m in zip(rows, mutants):
                if m.dtype == dtype:
                    row.caught_by = [t for t in m.sample if outcome[(t, m.factory)] == "failed"]
                    row.sampled = list(m.sample)
                    row.missed = [
                        f"{t} ({outcome[(t, m.factory)]})" for t in m.sample if outcome[(t, m.factory)] != "failed"
                    ]
            for test, spec, _ in selection:
                if spec in (*CORRECT_MODEL, *CORRECT_ATTENTION, *CORRECT_GRADIENT):
                    correct.setdefault(spec, [])
                    if outcome[(test, spec)] != "passed":
                        correct[spec].append(f"{test} ({outcome[(test, spec)]})")
    return rows, correct


def format_zoo(rows: list[ZooRow], correct: dict) -> str:

    body = [
        [
            r.name,
            r.found or "-",
            "yes" if r.located else f"NO ({r.declared})",
            None if r.ratio is None else float(r.ratio),
            r.exposing_case or "-",
            r.named or "-",
            f"{len(r.caught_by)}/{len(r.sampled)}" if r.sampled else "-",
        ]
        for r in rows
    ]
    header = ["mutant", "first divergence", "located", "ratio", "exposing case", "named as", "caught"]
    lines = [table(header, body), ""]
    for r in rows:
        if r.sampled:
            lines.append(
                f"{r.name}: caught by {', '.join(r.caught_by) or 'nothing'}"
                + (f"; MISSED by {', '.join(r.missed)}" if r.missed else "")
            )
    lines.append("")
    ratios = [r.ratio for r in rows if r.ratio is not None]
    caught = (
        f"{sum(r.caught for r in rows)} of {len(rows)} mutants caught by every sampled test"
        if any(r.sampled for r in rows)
        else "sampled pytest run skipped (--no-plugin)"
    )
    lines.append(
        f"{caught}; {sum(r.located for r in rows)} of {len(rows)} located at their declared stage; "
        f"{sum(r.named == r.bug_class for r in rows)} named as their declared bug class; "
        f"smallest ratio {min(ratios, default=float('nan')):.3g}"
    )
    for spec, failures in correct.items():
        lines.append(f"correct port {spec}: " + ("passes its sample" if not failures else f"FAILS {failures}"))
    return "\n".join(lines)
