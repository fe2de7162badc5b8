"""Plain-text tables for the commands, and how the tool's own failures are told apart."""

from __future__ import annotations

import errno
import traceback


class ToolError(Exception):
    """An exception inside vit-conformance itself (the mapping, capture, error model or
    comparison), never a finding about the port: ``verify`` exits 3 with its last frames."""


class UsageError(Exception):
    """Bad arguments or input (a port that cannot be loaded, a bad config or file): exit status 2,
    one line."""

    label = "usage error"


class CannotJudge(UsageError):
    """What verify cannot judge about a model, found by the tool inside the port's own call (the
    config has no word for a part, no adapter reads its module system): exit 2, passed through the
    port's call, never a finding about the port."""


class ResourceError(UsageError):
    """The machine lacks what the run needs (disk space, file handles, a writable TMPDIR): exit
    status 2 too, one line naming the resource and the figure needed."""

    label = "environment error"


def resource_problem(e: BaseException) -> str | None:
    """What an OS error says of the machine's resources, or None when it is no such error."""
    if not isinstance(e, OSError) or e.errno not in RESOURCE_ERRNOS:
        return None
    where = f" ({e.filename})" if getattr(e, "filename", None) else ""
    if e.errno == errno.EMFILE:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        where += f": it may open {soft} (ulimit -n; at most {hard})"
    what = {
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "the disk quota is exceeded",
        errno.EMFILE: "too many open files for this process",
        errno.ENFILE: "too many open files on the system",
        errno.EROFS: "a read-only file system",
    }[e.errno]
    return f"{what}{where}"


RESOURCE_ERRNOS = {
    getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EMFILE", "ENFILE", "EROFS") if hasattr(errno, name)
}


def tool_failure(e: BaseException, frames: int = 4) -> str:
    """What the tool's own failure says: a line saying so, the exception and its last frames."""
    cause = e.__cause__ if isinstance(e, ToolError) and e.__cause__ is not None else e
    tb = traceback.extract_tb(cause.__traceback__)[-frames:]
    lines = [
        f"INTERNAL ERROR of vit-conformance (a bug in the tool, not a finding about the port): {describe_exception(e)}"
    ]
    if cause is not e:
        lines.append(f"  caused by {describe_exception(cause)}")
    lines += [f"  at {f.filename}:{f.lineno} in {f.name}: {f.line}" for f in tb]
    remote = getattr(e, "remote_traceback", "")  # it failed in the port's process: the frames there
    if remote:
        lines.append("  in the port's process:")
        lines += [f"  {line}" for line in remote.strip().splitlines()[-2 * frames - 1 :]]
    lines.append("  please report it with the command that produced it")
    return "\n".join(lines)


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
