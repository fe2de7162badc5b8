"""Which of verify's cases each model mutant is located by, alone, in each dtype: the evidence
for the cases verify keeps at full size (``conformance.verify.cases.FULL_SIZE``).

    python -m conformance zoo --cover [--json docs/data/case_cover.json]

For every model mutant of the zoo and every dtype it is run in, verify on each default case by
itself: located (the first divergence is the declared stage) or not, and the separation. A
greedy cover then picks the fewest cases that locate every (mutant, dtype) the whole set
locates, preferring the cases where the separation is largest.
"""

from __future__ import annotations

import sys

from conformance.verify.cases import FULL_SIZE_BATCH, case_plan, default_cases
from conformance.zoo.catalogue import MUTANTS
from conformance.numerics.precision import PORT_DTYPES
from impls import get_config, load_factory
from conformance.verify import verify


def _model_mutants():
    """(mutant, its config, its factory) for every model mutant of the zoo."""
    for mutant in MUTANTS.values():
        if mutant.level == "model":
            yield mutant, get_config(mutant.config), load_factory(mutant.factory)


def _row(mutant, config, make, cases, dtype: str, **key) -> dict:
    """verify on ``cases``: located at the mutant's declared stage, and the separation."""

    report = verify(make, config, port=mutant.name, cases=cases, dtype=dtype)
    return {
        "mutant": mutant.name,
        "dtype": dtype,
        **key,
        "located": report.located() == mutant.first_divergence,
        "separation": min(report.separation() or 0.0, 1e300),
    }


def matrix(dtypes=PORT_DTYPES) -> list[dict]:
    """One row per (mutant, dtype, case): located alone, and its separation."""
    rows = []
    for mutant, config, make in _model_mutants():
        for dtype in dtypes:  # as the zoo runs every model mutant
            rows += [
                _row(mutant, config, make, [case], dtype, case=case.name) for case in default_cases(config, None, 0)
            ]
        print(f"{mutant.name}: done", file=sys.stderr)
    return rows


STRONG = 10.0  # a case covers a mutant it locates this far outside the tolerance (or as far as any case does)


def cover(rows: list[dict]) -> list[str]:
    """The fewest cases (greedy) that locate every (mutant, dtype) some case locates, each at a
    separation of ``STRONG`` or at the best any single case reaches when that is less; a bug whose
    separation is a random draw (active dropout: another mask each call) by any case that locates
    it, its best case being chance's."""
    random = {m.name for m in MUTANTS.values() if m.bug_class == "active_dropout"}
    best: dict[tuple, float] = {}
    for r in rows:
        if r["located"]:
            key = (r["mutant"], r["dtype"])
            best[key] = max(best.get(key, 0.0), float(r["separation"]))
    need = set(best)
    by_case: dict[str, set] = {}
    strength: dict[str, float] = {}
    for r in rows:
        key = (r["mutant"], r["dtype"])
        if r["located"] and float(r["separation"]) >= (0.0 if r["mutant"] in random else min(STRONG, best[key])):
            by_case.setdefault(r["case"], set()).add(key)
            strength[r["case"]] = strength.get(r["case"], 0.0) + min(float(r["separation"]), 1e6)
    chosen: list[str] = []
    while need:
        best = max(by_case, key=lambda c: (len(by_case[c] & need), strength.get(c, 0.0)))
        if not by_case[best] & need:
            break
        chosen.append(best)
        need -= by_case[best]
    return chosen


def batches(dtypes=PORT_DTYPES, sizes=(3, FULL_SIZE_BATCH)) -> list[dict]:
    """One row per (mutant, dtype, batch): the full-size plan run whole in cases of at most that
    many images, located and its separation."""
    rows = []
    for mutant, config, make in _model_mutants():
        for dtype in dtypes:
            for batch in sizes:
                cases = [made() for _, made in case_plan(config, None, 0, full_size=True, max_batch=batch)]
                rows.append(_row(mutant, config, make, cases, dtype, batch=batch))
    return rows


def lost(rows: list[dict], batch: int = FULL_SIZE_BATCH) -> list[tuple[str, str]]:
    """The (mutant, dtype) the plan in batches of 3 locates and the plan in batches of ``batch``
    does not, or locates less than ``STRONG`` (or than the batch of 3 does, where that is less)."""
    by = {(r["mutant"], r["dtype"], r["batch"]): r for r in rows}
    out = []
    for (mutant, dtype, b), three in by.items():
        if b != 3 or not three["located"]:
            continue
        other = by[(mutant, dtype, batch)]
        if not other["located"] or other["separation"] < min(STRONG, three["separation"]):
            out.append((mutant, dtype))
    return out
