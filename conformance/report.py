"""Plain-text tables for the commands."""

from __future__ import annotations


def fmt(value, spec: str = ".2e") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "ok" if value else "FAIL"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def table(headers: list[str], rows: list[list], align_left: int = 1) -> str:
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]

    def line(values):
        return "  ".join(v.ljust(w) if i < align_left else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths)))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def describe_exception(e: BaseException, limit: int = 1500) -> str:
    """What a port said, in full within reason, on one line: a load error's list of missing
    keys is its point."""
    text = " | ".join(line.strip() for line in str(e).strip().splitlines() if line.strip())
    text = text if len(text) <= limit else text[:limit] + " ..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
