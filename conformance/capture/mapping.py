"""The user's weight mapping: a rename table or key function, or a whole-state convert, and how
their callables are called."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping


class LoadError(ValueError):
    """The mapped weights do not fit the model: names the keys and shapes."""


def _pattern(canonical: str) -> re.Pattern:
    body = re.escape(canonical).replace(re.escape("{i}"), r"(?P<i>\d+)")
    return re.compile(rf"(^|\.){body}(?=\.|$)")


def rename_function(table: Mapping[str, str | None] | Callable[[str], str | None]) -> Callable[[str], str | None]:
    """A key function from a rename table: each entry renames a dotted segment run at segment
    boundaries, in order (``"norm1": "ln_attn"``, ``"blocks.{i}.mlp.fc1": "layers.{i}.ff.0"``);
    an entry that maps to None drops the key (the model has no place for it)."""
    if callable(table):
        return table
    rules = [(_pattern(k), v) for k, v in table.items()]

    def rename(key: str) -> str | None:
        for pattern, new in rules:
            m = pattern.search(key)
            if m is None:
                continue
            if new is None:
                return None
            repl = new.replace("{i}", m.group("i")) if "i" in pattern.groupindex else new
            key = key[: m.start()] + m.group(1) + repl + key[m.end() :]
        return key

    return rename


def module_of(key: str) -> str:
    return key.rpartition(".")[0]


def common_module(paths) -> str | None:
    parts = [p.split(".") if p else [] for p in paths]
    if not parts:
        return None
    common = []
    for segs in zip(*parts):
        if len(set(segs)) != 1:
            break
        common.append(segs[0])
    return ".".join(common)


def config_argument(fn, positional: int | None, keyword: str = "config") -> str | None:
    """How ``fn`` takes its second argument: "keyword" (it names ``keyword`` or takes **kwargs),
    "positional" (it requires ``positional`` arguments, or takes *args), or None."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: called with its one argument
        return None
    kinds = inspect.Parameter
    if any(p.name == keyword and p.kind != kinds.POSITIONAL_ONLY for p in params) or (
        keyword != "config" and any(p.kind == kinds.VAR_KEYWORD for p in params)
    ):
        return "keyword"
    if positional is None:
        return None
    required = [
        p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(required) >= positional or any(p.kind == kinds.VAR_POSITIONAL for p in params):
        return "positional"
    return None
