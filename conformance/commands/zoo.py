"""``python -m conformance zoo [--cover]``: the bug zoo through the front door (conformance.zoo.run),
or the cover of verify's cases over it (conformance.zoo.cover); printed, as JSON, or docs' table."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from conformance.commands.docs import zoo_table
from conformance.verify.cases import FULL_SIZE_BATCH, default_cases
from conformance.zoo import MUTANTS
from conformance.zoo.cover import batches, cover, lost, matrix
from conformance.zoo.run import format_zoo, run_zoo
from impls import get_config


def main(args) -> int:
    """``zoo``: every mutant (or ``--mutant``s) through verify and the plugin, the table printed."""
    names = args.mutant or list(MUTANTS)
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        print(f"usage error: unknown mutants {unknown}; known: {sorted(MUTANTS)}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows, correct = run_zoo(
        [MUTANTS[n] for n in names], with_plugin=not args.no_plugin, workers=args.workers, all_dtypes=not args.no_dtypes
    )
    print(format_zoo(rows, correct))
    print(f"({time.perf_counter() - t0:.0f} s)")
    measured = {
        "mutants": [asdict(r) | {"located": r.located, "caught": r.caught} for r in rows],
        "correct_ports": correct,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(measured, f, indent=1)
            f.write("\n")
    if args.markdown:
        print("\n" + zoo_table(measured))
    ok = all(r.located and r.named == r.bug_class and (r.caught or args.no_plugin) for r in rows)
    ok = ok and not any(correct.values())
    return 0 if ok else 1


def cover_main(args) -> int:
    """``zoo --cover``: which case locates each mutant alone, written as case_cover.json's data."""
    rows = matrix()
    result = {
        "rows": rows,
        "cover": cover(rows),
        "cases": [c.name for c in default_cases(get_config("vit_test_token"))],
        "batches": batches(),
    }
    text = json.dumps(result, indent=1) + "\n"
    if getattr(args, "json", None):
        Path(args.json).write_text(text)
    print(f"cover: {result['cover']}; lost in batches of {FULL_SIZE_BATCH}: {lost(result['batches'])}", file=sys.stderr)
    return 0
