"""The user's weight mapping: a rename table or key function, or a whole-state convert, and how
their callables are called."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import cache, lru_cache

import numpy as np

from conformance.report import CannotJudge
import inspect


class LoadError(ValueError):
    """The mapped weights do not fit the model: names the keys and shapes."""


def rename_function(table: Mapping[str, str | None] | Callable[[str], str | None]) -> Callable[[str], str | None]:
    """A key function from a rename table: each entry renames the first dotted segment run it
    matches at segment boundaries (``"norm1": "ln_attn"``, ``"blocks.{i}.mlp.fc1": "layers.{i}.ff.0"``),
    in order, and only in what no earlier entry wrote: an entry never renames another's output
    (``"blocks.{i}.norm1": "layers.{i}.0.norm"`` then ``"norm": "final.norm"`` leaves the first's
    ``norm`` alone). An entry that maps to None drops the key (the model has no place for it)."""
    if callable(table):
        return table
    return _table_rename(tuple(table.items()))


@lru_cache(maxsize=64)
def _table_rename(items: tuple[tuple[str, str | None], ...]) -> Callable[[str], str | None]:
    """One key function per table, each key's answer remembered: a convert builds the function
    and renames the same keys on every call (every case of every verify)."""
    rules = [([_segment(p) for p in k.split(".")], v) for k, v in items]

    @cache
    def rename(key: str) -> str | None:
        parts = [(segment, False) for segment in key.split(".")]  # (segment, written by an entry)
        for pattern, new in rules:
            at = _find(parts, pattern)
            if at is None:
                continue
            if new is None:
                return None
            start, index = at
            text = new.replace("{i}", index) if index is not None else new
            parts[start : start + len(pattern)] = [(s, True) for s in text.split(".")] if text else []
        return ".".join(s for s, _ in parts)

    return rename


def _segment(canonical: str) -> re.Pattern:
    return re.compile(re.escape(canonical).replace(re.escape("{i}"), r"(?P<i>\d+)") + r"\Z")


def _find(parts: list[tuple[str, bool]], pattern: list[re.Pattern]) -> tuple[int, str | None] | None:
    """Where ``pattern`` first matches segments no entry has written: (start, the block index
    ``{i}`` stood for), or None."""
    n = len(pattern)
    for start in range(len(parts) - n + 1):
        window = parts[start : start + n]
        if any(written for _, written in window):
            continue
        matches = [want.match(segment) for (segment, _), want in zip(window, pattern)]
        if all(matches):
            index = next((m.group("i") for m in matches if "i" in m.re.groupindex), None)
            return start, index
    return None


def unit_axes(value, shape):
    """``value`` reshaped to ``shape`` where the two differ only in axes of size 1 (a
    ``pos_embed`` (1, N, D) for a (N, D) parameter, a ``cls_token`` (1, 1, D) for a (1, D) one);
    else ``value`` as it is (its shape is then a finding)."""

    if (
        shape is not None
        and value.shape != tuple(shape)
        and value.size == int(np.prod(shape))
        and [d for d in value.shape if d != 1] == [d for d in shape if d != 1]
    ):
        return value.reshape(shape)
    return value


PATCH_ORDERS = ("c p1 p2", "p1 p2 c")  # a flattened patch: the conv kernel's order, or einops' channels last


def patch_layout(key: str, value, shape, config, order: str | None):
    """A canonical patch weight in the model's flattened-patch ``order``: the conv kernel
    (D, C, ph, pw) for a Linear (D, C * ph * pw), and the patch norm's (C * ph * pw,) vectors,
    which are in (c p1 p2) canonically. Without an order where one is needed, exit 2 (``CannotJudge``,
    raised inside the port's build: the port's declaration, never a finding about it): no shape tells
    the two apart."""

    to_linear = key == "patch_embed.proj.weight" and value.ndim == 4 and shape is not None and len(shape) == 2
    if not (to_linear or key.startswith("patch_embed.patch_norm.")):
        return value
    if order is None:
        where = "takes the patch kernel as a Linear" if to_linear else "normalises the raw patches"
        raise CannotJudge(
            f"the model {where} ({key!r} into {tuple(shape) if shape is not None else '?'}): say how it flattens "
            "a patch, ModelPort(patch_order='p1 p2 c') (einops' 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)') or "
            "patch_order='c p1 p2' (a conv kernel reshaped)"
        )
    C, (ph, pw) = config.in_chans, config.patch_size
    grid = value.reshape(-1, C, ph, pw)
    if order == "p1 p2 c":
        grid = grid.transpose(0, 2, 3, 1)
    return grid.reshape(value.shape[0], -1) if to_linear else grid.reshape(-1)


def prefix_rows(key: str, value, config, prefix: str):
    """The position table as a model that keeps its prefix tokens after the patches holds it
    (``ModelPort(prefix="last")``): the class and register tokens' rows after the patches'."""
    n = config.num_prefix_tokens
    if prefix != "last" or key != "pos_embed" or config.no_embed_class or not n:
        return value
    return np.roll(value, -n, axis=-2)


def patches_to_canonical(x, config, order: str | None):
    """A tap over flattened patches (..., C * ph * pw) from the model's ``order`` to (c p1 p2)."""
    if order != "p1 p2 c":
        return x
    C, (ph, pw) = config.in_chans, config.patch_size
    lead = x.shape[:-1]
    return x.reshape(*lead, ph, pw, C).transpose(*range(len(lead)), -1, -3, -2).reshape(*lead, -1)


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


def k_bias_free(convert: Callable, state, config) -> list[int]:
    """The blocks whose model has no k bias: ``convert`` (the port's, canonical state -> the
    model's) sends every entry of qkv.bias but the k third somewhere (q kᵀ + q b_kᵀ: the softmax
    removes the second term, a per-query constant, so the attention is the same function; its k tap
    is compared with b_k added back)."""
    if not (config.qkv_bias and config.k_bias and config.qkv_fused):  # a qkv.bias to probe
        return []
    D, keys = config.embed_dim, [f"blocks.{i}.attn.qkv.bias" for i in range(config.depth)]
    probe = {k: np.zeros(np.shape(v), np.float32) for k, v in state.items()}
    for i, k in enumerate(keys):  # every block's entries numbered apart, in one call
        probe[k] = np.arange(1, 3 * D + 1, dtype=np.float32) + i * 3 * D
    sent = set(np.concatenate([np.asarray(v, np.float64).ravel() for v in convert(probe).values()]))
    k_third = np.arange(D + 1, 2 * D + 1)
    return [
        i
        for i in range(config.depth)
        if not any(v + i * 3 * D in sent for v in k_third)
        and all(v + i * 3 * D in sent for v in np.r_[1 : D + 1, 2 * D + 1 : 3 * D + 1])
    ]
