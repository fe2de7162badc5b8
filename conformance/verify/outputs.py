"""verify's report files (``--json``, ``--plot``): checked before any work, never left from an
earlier run, never written over one of the run's inputs, written whole, and written for every
run, the ones that reach no verdict included.

The contract with the rest of verify: ``Outputs.prepare`` runs before anything else (a bad path
is a ``UsageError``; a report of an earlier run at the path is removed then); ``Outputs.write``
gives a verdict's exit status (0 or 1), or 2 when a file could not be written, the verdict
printed and the JSON report kept where it was written; ``Outputs.unfinished`` writes the report
of a run that ended without a verdict (exit 2, 3, or a signal's 128 + N).

The JSON holds every figure, non-finite ones too: JSON has no spelling for them, so a float
that is infinite or NaN is written as the string ``"Infinity"``, ``"-Infinity"`` or ``"NaN"``
(what ``float()`` reads back), wherever it is in the report.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from conformance.report import UsageError, describe_exception
from weights.atomic import replace_atomically
from weights.config import inline_json
from conformance.verify.report import plot_report
import stat

NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def jsonable(obj):
    """``obj`` with every float JSON cannot hold spelled as a string, NumPy scalars as Python's."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        return value if math.isfinite(value) else NON_FINITE.get(value, "NaN")
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    return obj


def dumps(report: dict) -> str:
    return json.dumps(jsonable(report), indent=1, allow_nan=False) + "\n"


def _module_file(spec: str | None) -> Path | None:
    """The file a port spec ('pkg.module:name') would be imported from, found without importing
    anything: this process's import path, its first entry the current directory."""
    if not spec or ":" not in spec:
        return None
    parts = spec.partition(":")[0].split(".")
    for entry in sys.path:
        base = Path(entry or os.curdir).joinpath(*parts)
        for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _same(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


class Outputs:
    """The report files one verify run writes."""

    def __init__(self, args):
        self.json: str | None = getattr(args, "json", None)
        self.plot: str | None = getattr(args, "plot", None)
        self.port = getattr(args, "port", None) or getattr(args, "attention", None) or getattr(args, "grad", None)
        self.ready = False  # the paths checked: a report may be written there

    def inputs(self, args) -> dict[str, Path]:
        """What the run reads: its weights, its config file, the port's module."""
        found = {}
        if getattr(args, "weights", None):
            found["--weights"] = Path(args.weights)
        config = getattr(args, "config", None)
        if config and not inline_json(config):
            found["--config"] = Path(config)
        module = _module_file(self.port)
        if module is not None:
            found[f"the port's module ({self.port})"] = module
        return found

    def prepare(self, args) -> None:
        """Each path writable, not a directory, not one of the run's inputs, and not the other
        flag's; then a report left there by an earlier run is removed, so a run that ends early
        never leaves another run's verdict behind."""
        paths = {flag: getattr(self, flag) for flag in ("json", "plot") if getattr(self, flag)}
        if len(paths) == 2 and os.path.abspath(paths["json"]) == os.path.abspath(paths["plot"]):
            raise UsageError(f"--json and --plot name the same file {paths['json']!r}")
        inputs = self.inputs(args)
        for flag, path in paths.items():
            target = Path(path)
            parent = target.parent if str(target.parent) else Path(".")
            if target.is_dir():
                raise UsageError(f"--{flag} {path!r} is a directory; give a file name")
            if not parent.is_dir():
                raise UsageError(f"--{flag} {path!r}: the directory {str(parent)!r} does not exist")
            if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
                raise UsageError(f"--{flag} {path!r}: not writable")
            for what, source in inputs.items():
                if _same(target, source) or os.path.abspath(target) == os.path.abspath(source):
                    raise UsageError(f"--{flag} {path!r} is {what}, an input of this run: give another file name")
            if flag == "plot":
                _check_plot_format(target)
        for path in paths.values():
            if os.path.lexists(path) and _regular(path):
                os.unlink(path)
        self.ready = True

    def write(self, report, text: str) -> int:
        """The verdict on stdout, then the JSON report and the plot, each written whole; a write
        that fails after the verdict is exit 2 with one line (the verdict stands printed)."""
        print(text)
        sys.stdout.flush()
        try:
            if self.json:
                body = dumps(report.to_dict())
                _write(self.json, lambda path: Path(path).write_text(body))
            if self.plot:
                fmt = Path(self.plot).suffix[1:].lower() or "png"
                _write(self.plot, lambda path: plot_report(report, path, fmt=fmt))
        except (OSError, ValueError) as e:
            print(f"usage error: could not write the report: {describe_exception(e)}", file=sys.stderr)
            return 2
        return 0 if report.conformant else 1

    def unfinished(self, code: int, reason: str) -> None:
        """The JSON report of a run that reached no verdict (exit ``code``), where its path was
        checked; best effort: the run's own line is what the user reads."""
        if not (self.ready and self.json):
            return
        what = {2: "usage or environment error", 3: "internal error of the tool"}.get(code, "cancelled")
        body = dumps(
            {
                "port": self.port,
                "conformant": False,
                "verdict": None,
                "exit_code": code,
                "error": f"{what}: {reason}",
                "first_divergence": None,
                "stages": [],
                "failures": [],
            }
        )
        try:
            _write(self.json, lambda path: Path(path).write_text(body))
        except (OSError, ValueError):
            pass


def _regular(path: str) -> bool:
    """Whether ``path`` is replaced whole: a regular file (through a symlink too: the link is then
    replaced, never written through), or nothing yet. A device such as /dev/stdout or a FIFO is
    written into as it is, and never removed."""

    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True


def _write(path: str, write) -> None:
    """``write(p)`` onto ``path``: whole, through a temporary renamed into place, where the path
    is a file; straight into it where it is a device or a FIFO."""

    if os.path.exists(path) and not _regular(path):
        write(path)
    else:
        replace_atomically(path, write)


def _check_plot_format(target: Path) -> None:
    """--plot's suffix names a format matplotlib writes (PNG, SVG, PDF...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = target.suffix[1:].lower()
    if suffix and suffix not in formats:  # none: PNG
        raise UsageError(
            f"--plot {str(target)!r}: matplotlib writes {', '.join('.' + f for f in sorted(formats))}; "
            f"{'no suffix' if not suffix else '.' + suffix} is none of them"
        )
