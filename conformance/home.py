"""The project's own packages, and a module of the user's that would stand in for one.

``python -m conformance`` puts the current directory first on the import path, so a port's
folder holding ``weights.py`` or ``impls/`` would be imported as this project's package of that
name, and verify would fail in ways that look like a finding. ``shadowing`` names such a clash
before anything else is imported (verify and convert: exit 2; the plugin: a usage error)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGES = ("weights", "impls")  # conformance itself is the one running
HOME = Path(__file__).resolve().parent.parent  # the directory holding conformance/, weights/, impls/


def _origin(name: str) -> str | None:
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None)
    try:
        spec = importlib.util.find_spec(name)  # a top-level name: found without importing it
    except (ImportError, ValueError):
        return None
    return None if spec is None else spec.origin


def shadowing() -> str | None:
    """Why one of the project's packages would be imported from somewhere else, or None."""
    for name in PACKAGES:
        origin = _origin(name)
        if origin is None:
            continue
        if not Path(origin).resolve().is_relative_to(HOME / name):
            return (
                f"{origin!r} shadows vit-conformance's package {name!r} (the current directory, or an earlier "
                f"entry of the import path, comes first): rename it, or run from another directory"
            )
    return None
