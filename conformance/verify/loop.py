"""One case loop for every check. The forward (a whole model against the oracle), the backward
(a gradient factory against the float64 reference) and an attention port are its variants: each
says how to call the port on a handed case and how to compare what came back; the loop does the
rest the same way for all three.

For each case, in order: the loop is handed the reference built (held, or streamed as the
comparison reads it); a case no port can represent in the dtype is skipped with the reason
(before the port runs, or, streamed, when the reference gets there: what the case found is then
taken back); the port side (``portside``: this process
or the port's own) hands the port read-only copies of the case and tells its exceptions and its
writes to its inputs as findings; each comparison's
row keeps its worst case; the earliest divergence in the variant's order is kept with its case.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from conformance.numerics.error_model import BeyondRange
from conformance.verify.cases import Case
from conformance.verify.report import VerifyReport


class Result(Protocol):
    """A row of a report: a stage's, a tensor's gradient's."""

    name: str
    ok: bool

    @property
    def separation(self) -> float:
        """The error over its tolerance (> 1: outside)."""


class Reference(Protocol):
    """What the loop needs of a case's reference (``CaseModel``, ``GradModel``, ``AttentionModel``)."""

    def beyond_range(self) -> str | None:
        """Why no port can represent the case in the dtype, or None (a streamed reference may
        raise ``BeyondRange`` while compared instead)."""

    def settle(self) -> None:
        """Run what the comparison did not read (a streamed reference, where the port failed or
        emitted little), raising ``BeyondRange`` if it is."""


class Variant(Protocol):
    """What differs between the checks."""

    def run(self, case: Case, reference, report: VerifyReport, label: str) -> Any | None:
        """Call the port on the case (through its ``PortSide``): its output, or None once a
        finding says why not."""

    def compare(self, out, reference, report: VerifyReport, label: str, outcome: Outcome) -> Iterable[Result]:
        """The rows for one case (findings about the output go to ``report``, divergences the
        rows do not show to ``outcome.diverged``)."""

    def index(self, result: Result) -> int:
        """A row's place in the order a divergence is located in (model order, backward order)."""


@dataclass
class Outcome:
    """What the loop found: per row the worst case's result, the earliest divergence."""

    worst: dict[str, Result] = field(default_factory=dict)
    first: tuple[int, str, str] | None = None  # (place in the variant's order, row name, case)
    first_result: Result | None = None
    first_judged: int | None = None  # the place of the first case judged (the determinism re-run's), not held
    last_judged: int | None = None  # the place of the last case judged (the re-run's at full size)

    def earlier(self, index: int) -> bool:
        """Whether a divergence at ``index`` would be the first (a variant diagnoses it then)."""
        return self.first is None or index < self.first[0]

    def diverged(self, index: int, name: str, label: str, result: Result | None = None) -> None:
        if self.earlier(index):
            self.first, self.first_result = (index, name, label), result


def run_cases(report: VerifyReport, variant: Variant, cases: Iterable[tuple[str, Case, Reference]]) -> Outcome:
    outcome = Outcome()
    for index, (label, case, reference) in enumerate(cases):
        rows = _judge(report, variant, outcome, label, case, reference)
        del case, reference  # the next case is made without this one held (a full-size case's weights)
        if rows is None:
            continue
        if outcome.first_judged is None:
            outcome.first_judged = index
        outcome.last_judged = index
        for r in rows:
            prev = outcome.worst.get(r.name)
            if prev is None or r.separation > prev.separation:
                outcome.worst[r.name] = r
                report.worst_case[r.name] = label
            if not r.ok:
                outcome.diverged(variant.index(r), r.name, label, r)
    return outcome


def _judge(report: VerifyReport, variant: Variant, outcome: Outcome, label: str, case: Case, reference):
    """One case's rows, or None where it is skipped as beyond the dtype's range."""
    beyond = reference.beyond_range()
    if beyond:  # judging it would be a false alarm
        report.skipped.append(f"{label}: {beyond}")
        return None
    # A streamed reference finds that it is beyond range as it runs: the case is then told as
    # skipped, and what its port call and comparison found is taken back.
    failures, first = len(report.failures), (outcome.first, outcome.first_result)
    try:
        out = variant.run(case, reference, report, label)
        rows = [] if out is None else list(variant.compare(out, reference, report, label, outcome))
        reference.settle()
    except BeyondRange as e:
        del report.failures[failures:]
        outcome.first, outcome.first_result = first
        report.skipped.append(f"{label}: {e}")
        return None
    return rows
