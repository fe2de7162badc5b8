"""The forward check: a port against the float64 oracle on verify's cases, stage by stage."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import numpy as np

from conformance.diagnosis import Diagnosis, diagnose, dropout, guarded
from conformance.diagnosis.classes import PADDING_ATTENDED
from conformance.diagnosis.scan import Scan
from conformance.numerics.compare import StageResult, compare_outputs
from conformance.numerics.error_model import CaseModel, parallel
from conformance.numerics.mapped import let_go
from conformance.numerics.precision import UNIT_ROUNDOFF
from conformance.returned import as_taps
from conformance.sandbox.heap import return_freed_memory
from conformance.sandbox.portside import PortSide, port_side
from conformance.support import Unsupported, not_supported
from conformance.verify.budget import ahead
from conformance.verify.cases import Case, cached, held_models, holdable, iter_plan, seeded_cases, verify_plan
from conformance.verify.loop import Outcome, run_cases
from conformance.verify.packed import PackedModel, nonfinite_outside, packed_plan, packed_shape, unpack
from conformance.verify.report import Report, finding
from impls import tap_names
from impls.protocol import ViTConfig
from conformance.verify import quantized as q
import sys


class Forward:
    """The forward variant: build the port on the case's state, run it on its images (through its
    ``PortSide``), compare every tap it emitted (and both passes of a captured model) with the
    oracle's."""

    def __init__(self, side: PortSide, config: ViTConfig, dtype: str, policy: str):
        self.side, self.config, self.dtype, self.policy = side, config, dtype, policy
        self.names = tap_names(config)
        self.diagnoses: dict = {}  # (stage, case) -> Diagnosis, where a case diverged first
        self.scan = None  # conformance.diagnosis.scan.Scan: systematic errors pooled over held cases
        self.case: Case | None = None  # the case run last (a quantized port's oracle is made from it)

    def run(self, case: Case, model, report: Report, label: str):
        self.case = case
        out, findings = self.side.forward(case, self.config, self.dtype)
        for stage, reason in findings:
            finding(report, label, stage, reason)
        return out

    def compare(self, out, model, report: Report, label: str, outcome: Outcome) -> list[StageResult]:
        names = self.names
        if isinstance(out, Mapping):
            unknown = sorted(set(out) - set(names))
            if unknown:
                finding(report, label, unknown[0], f"unknown tap names {unknown}; known: see impls.tap_names")
        taps = as_taps(out)  # what the port returned, with what capture knows beside it
        report.unseen.update(taps.unseen)
        report.sources.update(taps.sources)
        if taps.path is not None:  # a compiled model's: how this case ran
            report.paths[label] = taps.path
        for stage, reason in taps.findings:  # what capture found about the model
            if not any(f["stage"] == stage and f["reason"] == reason for f in report.failures):
                finding(report, label, stage, reason)
            if stage in names:
                outcome.diverged(names.index(stage), stage, label)
        if taps.quantized is not None:  # judged on its own weights, its cost measured
            model = self._quantized(out, model, report, label, outcome)
        second = taps.second  # a second pass off the model's own path: judged too
        results = compare_outputs(
            out.own_pass() if second is not None else out,
            model,
            dtype=self.dtype,
            policy=self.policy,
            also=() if second is None else (second,),
        )
        for r in results:
            if not r.ok and (r.ratio is None or not np.isfinite(r.ratio)):
                finding(report, label, r.name, r.reason)
        own = out.own_pass() if second is not None else out
        self._diagnose(results, own, model, label, outcome)
        if self.scan is not None and isinstance(own, Mapping):
            self.scan.add(own, model, [r for r in results if r.name in own])
        return results

    def _quantized(self, out, model, report: Report, label: str, outcome: Outcome):
        """A quantized port's case (conformance.verify.quantized): its weights against their float
        weights, its cost against the float model, and the model its kernels are judged by."""
        case, quantized = self.case, out.quantized
        for stage, reason, named in q.beyond_half_step(quantized, case.state, self.config, self.dtype):
            finding(report, label, stage, reason)
            if outcome.earlier(self.names.index(stage)):
                outcome.diverged(self.names.index(stage), stage, label)
                if named:
                    self.diagnoses[(stage, label)] = Diagnosis(stage, label, "observed", named)
        rows = q.quantization_cost(out, case, self.config, self.dtype)
        q.record_cost(report, quantized.what, rows, label)
        beyond = next((r for r in rows if q.costs_too_much(r)), None)
        if beyond is not None:
            finding(report, label, beyond["stage"], q.costs_more(beyond))
            outcome.diverged(self.names.index(beyond["stage"]), beyond["stage"], label)
        return q.KernelModel(self.config, case.state, quantized, case.images, self.dtype, stream=model.stream)

    def _diagnose(self, results, out, model, label: str, outcome: Outcome) -> None:
        """Fit the bug classes where this case diverges, if earlier than any case before it (the
        port's outputs are not held past the case)."""
        first = next((r for r in results if not r.ok), None)
        if first is None or not isinstance(out, Mapping) or first.name not in out:
            return
        if not outcome.earlier(self.names.index(first.name)):
            return
        self.diagnoses[(first.name, label)] = guarded(
            first.name, label, lambda: diagnose(first.name, out, model, self.dtype, label)
        )

    def index(self, result: StageResult) -> int:
        return self.names.index(result.name)


class Packed(Forward):
    """The forward variant on packed batches (``conformance.verify.packed``): each row of the
    port's taps, its padding cut off, compared with the oracle on that image alone."""

    def compare(self, out, model, report: Report, label: str, outcome: Outcome) -> list[StageResult]:
        returned = as_taps(out)
        report.unseen.update(returned.unseen)  # a captured model's, told once for the batch
        report.sources.update(returned.sources)
        for stage, reason in returned.findings:
            finding(report, label, stage, reason)
        taps = dict(returned)
        batch, length = model.shape
        for name in list(taps):
            if name not in self.names:
                finding(report, label, name, f"unknown tap name {name!r}; known: see impls.tap_names")
                del taps[name]
                continue
            want, got = packed_shape(name, self.config, batch, length), np.shape(taps[name])
            if tuple(got) != want:
                finding(
                    report,
                    label,
                    name,
                    f"tap {name} has shape {tuple(got)}, expected {want}: a packed batch of "
                    f"{batch} rows of {length} patches, padding included",
                )
                outcome.diverged(self.names.index(name), name, label)
                del taps[name]
        for name, value in taps.items():
            where = nonfinite_outside(name, value, model.rows, self.config)
            if where is not None:
                finding(report, label, name, where)
                outcome.diverged(self.names.index(name), name, label)
        results = []
        for i, ((_, (gh, gw)), reference) in enumerate(zip(model.rows, model.models)):
            row, row_label = unpack(taps, i, gh * gw, self.config), f"{label}: image {i + 1}, {gh}x{gw}"
            rows = super().compare(row, reference, report, row_label, outcome)
            for stage, case in [k for k in self.diagnoses if k[1] == row_label]:  # the loop knows the batch's label
                diagnosis = self.diagnoses.pop((stage, case))
                if _leaks(row, stage, self.dtype):
                    diagnosis = Diagnosis(stage, row_label, "observed", PADDING_ATTENDED)
                self.diagnoses.setdefault((stage, label), diagnosis)
            results += rows
        return results


def _leaks(row: Mapping, name: str, dtype: str) -> bool:
    """Whether attention weights ``name`` of one image, its padding cut off, sum to less than 1 over
    its own keys by more than a correct softmax's rounding could: every weight rounded once and
    the normaliser's sum, (N + 2) u, taken four times over."""

    if not name.endswith("weights") or name not in row:
        return False
    w = np.asarray(row[name], np.float64)
    deficit = 1.0 - w.sum(-1)
    return bool(np.all(np.isfinite(deficit)) and deficit.max() > 4 * (w.shape[-1] + 2) * UNIT_ROUNDOFF[dtype])


def _progress(cases: int, stages: int, port: str, enabled: bool):
    """cases x stages, on standard error (tqdm), or a bar that shows nothing."""

    from tqdm import tqdm

    return tqdm(
        total=cases * stages,
        desc=f"verify {port}",
        unit=" stages",
        file=sys.stderr,
        disable=not enabled,
        leave=False,
        dynamic_ncols=True,
    )


def _one_at_a_time(cases):
    """(case, None) for each case, none held once the next is asked for."""
    for case in cases:
        yield case, None
        del case


def first_difference(first, second) -> str | None:
    """The first output of two calls that is not bitwise the same (``logits`` for a bare array)."""
    first = first if isinstance(first, Mapping) else {"logits": first}
    second = second if isinstance(second, Mapping) else {"logits": second}
    for name in first:
        a, b = np.asarray(first[name]), np.asarray(second.get(name))
        same = a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
        let_go(a, b)
        if not same:
            return name
    return None


def _packed(side: PortSide, config: ViTConfig) -> bool:
    """Whether the port takes packed batches, once it supports ``config`` (else Unsupported, why)."""

    why = side.unsupported(config)
    if why:
        raise not_supported(why)
    if side.inputs == "naflex" and not config.dynamic_img_size:
        raise Unsupported(
            "config not supported by a port of packed batches: its images are on several grids, "
            "the config needs dynamic_img_size=True"
        )
    return side.inputs == "naflex"


def verify(
    make: Callable | PortSide,
    config: ViTConfig,
    *,
    port: str = "port",
    state: dict | None = None,
    cases: list[Case] | None = None,
    seed: int = 0,
    dtype: str = "float32",
    policy: str = "mixed",
    progress: bool = False,
    scan=None,
) -> Report:
    """``make``: a port factory (run in this process) or a ``PortSide`` (``Isolated``: the port in
    a process of its own). ``progress``: a bar of cases and stages on standard error. ``scan``:
    the ``conformance.diagnosis.scan.Scan`` to pool into below float32 (its calibration's)."""
    side = port_side(make, port)
    packed, small = _packed(side, config), cached(config)  # a small config's given cases are held too
    plan = None
    seeded = cases is None and state is None and small and not packed
    if seeded:
        pairs = seeded_cases(config, seed, dtype)
    elif cases is not None and small and not packed and holdable(cases):  # by content: a repeated case's oracle reused
        pairs = held_models(config, cases, dtype)
    else:  # one case in memory at a time (two where the next fits): weights, images, oracle, outputs
        if cases is None:
            plan = packed_plan(config, state, seed) if packed else verify_plan(config, state, seed)
        pairs = _one_at_a_time(iter_plan(plan, ahead(config)) if cases is None else cases)
    report = Report(port, config, cases=[], dtype=dtype)
    variant = (Packed if packed else Forward)(side, config, dtype, policy)
    variant.scan = _scan(scan, dtype, seeded, small)

    total = len(pairs) if isinstance(pairs, tuple) else len(cases if cases is not None else plan)
    bar = _progress(total, len(variant.names), report.port, progress)

    last = []  # a streamed plan's last case, kept for the determinism re-run (nothing is held after it)

    def judged():
        for case, model in pairs:
            report.cases.append(case.name)
            bar.set_postfix_str(case.name, refresh=False)
            # a held case's oracle was built with it; a streamed one runs as the comparison reads it
            if model is not None:
                yield case.name, case, model
            elif packed:
                yield case.name, case, PackedModel(config, case, dtype)
            else:
                yield case.name, case, CaseModel(config, case.state, case.images, dtype, stream=True)
            bar.update(len(variant.names))
            if model is None:
                if len(report.cases) == total:
                    last.append(case)
                del case
                if not small:
                    return_freed_memory()

    try:
        with contextlib.nullcontext() if isinstance(pairs, tuple) else parallel():  # streamed: threads
            outcome = run_cases(report, variant, judged())
    finally:
        bar.close()
    names = variant.names
    report.stages = [outcome.worst[n] for n in names if n in outcome.worst]
    for n in report.unseen:
        report.sources.pop(n, None)
    if outcome.first is not None:
        report.first_divergence = outcome.first[1]
        report.diagnosis = variant.diagnoses.get(outcome.first[1:])
    elif report.failures:
        report.first_divergence = report.failures[0]["stage"]  # load or forward: before any stage
    if outcome.first_judged is not None and not report.failures:
        i = outcome.first_judged  # made again where the run let it go (full size: its weights)
        if last and outcome.last_judged == total - 1:  # the last case, at hand: its weights not drawn again
            case = last.pop()
        else:
            case = cases[i] if cases is not None else pairs[i][0] if isinstance(pairs, tuple) else plan[i][1]()
        _determinism(report, side, case, config, dtype)
    if variant.scan is not None:
        _systematic(report, variant.scan, names)
    return report


def _scan(given, dtype: str, seeded: bool, small: bool):
    """The scan of errors below the dtype's rounding, pooled over the cases: a small config's seeded
    ones (its given cases, held or not, are not scanned), a full-size model's streamed ones (block
    0's stages and the model's); ``given``: the calibration's. None in float32, where every class
    the zoo has is located per element."""
    if dtype == "float32" or not (given is not None or seeded or not small):
        return None
    return given if given is not None else Scan(None if small else {0})


def _determinism(report: Report, side, case: Case, config: ViTConfig, dtype: str) -> None:
    """The port called twice on the same case: two results that differ are a finding (randomness at
    inference: dropout left active), named."""
    both, findings = side.twice(case, config, dtype)
    for stage, reason in findings:  # the re-run's own failure, told as what it is
        finding(report, case.name, stage, f"{reason} (on the determinism re-run)")
    for i, out in enumerate(both or ()):  # the same input twice: a compiled model compiling again is told there
        taps = as_taps(out)
        report.sources.update({k: v for k, v in taps.sources.items() if "compiled again" in v})
        if taps.path is not None:
            report.paths[f"{case.name}, the determinism re-run's call {i + 1}"] = taps.path
    differs = first_difference(*both) if both is not None else None
    if differs:
        finding(report, case.name, differs, "two calls on the same input differ (randomness at inference)")
        report.diagnosis = dropout(differs, case.name)
    if report.failures and report.first_divergence is None:
        report.first_divergence = report.failures[0]["stage"]


def _systematic(report: Report, scan, names) -> None:
    """Each stage where the pooled error is a class's difference, or runs along one beyond the
    correct ports' band, a finding; the earliest the first divergence where none is earlier (its
    diagnosis the scan's)."""
    found = scan.verdict(report.dtype)
    seen = set()
    for s in found:
        if s.stage not in seen:
            seen.add(s.stage)
            finding(report, f"pooled over {s.cases} cases", s.stage, s.reason(report.dtype, scan.bands(report.dtype)))
    if not found:
        return
    first, current = found[0], report.first_divergence
    if current is None or (current in names and names.index(first.stage) < names.index(current)):
        report.first_divergence = first.stage
        report.diagnosis = scan.diagnosis(first, f"pooled over {first.cases} cases", report.dtype)
