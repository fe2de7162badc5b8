"""Files written whole or not at all: a temporary file (or directory) beside the target, renamed
into place. The target is the old file or the whole new one, never half of one; a temporary
name stays within the file system's name limit; what is written gets the modes a plain
``open`` would give it (the umask's), or the replaced file's own mode."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

RANDOM = 8  # the characters tempfile adds to a name


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def temporary_affixes(path: Path) -> tuple[str, str]:
    """(prefix, suffix) for a hidden temporary beside ``path``: its last suffix kept (a writer may
    choose its format by it: .pth or .safetensors, .npz, .png), its stem cut so the whole name
    fits the file system's limit in bytes."""
    suffix = path.suffix
    room = _name_max(path.parent) - len(os.fsencode(suffix)) - RANDOM - 2  # "." and "."
    if room < 1:  # a suffix as long as the limit: no suffix then
        suffix, room = "", _name_max(path.parent) - RANDOM - 2
    stem = os.fsencode(path.name[: len(path.name) - len(suffix)] if suffix else path.name)[:room]
    return "." + stem.decode(errors="ignore") + ".", suffix


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _set_modes(tmp: Path, target: Path) -> None:
    """mkstemp's 0600 and mkdtemp's 0700 replaced by what ``open`` and ``mkdir`` give (the umask's),
    or by the replaced file's own mode."""
    mask = umask()
    if tmp.is_dir():
        os.chmod(tmp, 0o777 & ~mask)
        for root, dirs, files in os.walk(tmp):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o777 & ~mask)
            for f in files:
                os.chmod(os.path.join(root, f), 0o666 & ~mask)
        return
    old = target.lstat() if os.path.lexists(target) else None
    keep = old is not None and stat.S_ISREG(old.st_mode)
    os.chmod(tmp, stat.S_IMODE(old.st_mode) if keep else 0o666 & ~mask)


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)


def replace_atomically(path: str | os.PathLike, write: Callable[[Path], None], directory: bool = False) -> None:
    """``write(tmp)`` into a temporary beside ``path`` (a directory, made empty, when ``directory``),
    then rename it onto ``path``; on any exception (a full disk, a signal) the temporary is
    removed and the exception goes on. A symlink at ``path`` is replaced itself, never written
    through."""
    p = Path(path)
    prefix, suffix = temporary_affixes(p)
    if directory:
        tmp = Path(tempfile.mkdtemp(dir=p.parent, prefix=prefix, suffix=".tmp"))
    else:
        fd, name = tempfile.mkstemp(dir=p.parent, prefix=prefix, suffix=suffix)
        os.close(fd)
        tmp = Path(name)
    try:
        write(tmp)
        _set_modes(tmp, p)
        if directory and p.is_dir() and not p.is_symlink():
            old = Path(tempfile.mkdtemp(dir=p.parent, prefix=prefix, suffix=".old"))
            os.rename(p, old / "out")  # a directory cannot be renamed over another: moved aside first
            try:
                os.rename(tmp, p)
            except BaseException:
                os.rename(old / "out", p)
                raise
            finally:
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, p)  # onto a symlink: replaces the link, not what it points to
    except BaseException:
        remove(tmp)
        raise
