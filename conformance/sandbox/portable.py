"""What a port returns, checked in the port's own process before anything is materialised or
written for verify: a value that cannot be a stage (a ragged list, a list of mixed things, an
array far larger than any stage of the config could be: a lazily broadcast view of terabytes)
crosses as ``wire.Refused`` with the reason, which verify reads as a malformed output of that
tap, a finding about the port (exit 1), never a crash of either process.

The size limit: 16 times the largest stage of the config for this batch (a port may emit a
stage in another layout or with padding, never orders of magnitude more), and never below 4
times everything the port was handed or 2**24 elements (an attention or gradient check's
outputs are bounded by their inputs).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from conformance.returned import Taps

from conformance.sandbox.wire import Refused
from impls.stages import stage_of, tap_symbols
from impls import tap_names
from impls import tap_shapes

MIN_LIMIT = 2**24  # elements


def _numeric_tree(obj) -> bool:
    """A (nested) list or tuple of plain numbers only: what NumPy would make one array of."""
    if isinstance(obj, (list, tuple)):
        return all(_numeric_tree(v) for v in obj)
    return isinstance(obj, (int, float, complex, np.number)) and not isinstance(obj, bool)


class OutputLimits:
    """The checks for one case's outputs (``config``: the whole model's, for the stages' sizes)."""

    def __init__(self, case, config=None):
        handed = case.images.size + sum(np.size(v) for v in case.state.values())
        handed += 0 if case.context is None else case.context.size
        self.expected: dict[str, tuple[int, ...]] = {}
        if config is not None and case.patch_valid is not None:  # a packed batch: (B, L, ph pw C) patches
            batch, length = case.images.shape[:2]
            self.expected = {n: packed_shape(n, config, batch, length) for n in tap_names(config)}
        elif config is not None:
            size = None if not config.dynamic_img_size else tuple(case.images.shape[-2:])
            self.expected = tap_shapes(config, case.images.shape[0], size)
        largest = max((int(np.prod(s)) for s in self.expected.values()), default=0)
        self.limit = max(16 * largest, 4 * handed, MIN_LIMIT)

    def portable(self, out, name: str | None = None):
        """``out`` with each value that cannot be a stage replaced by a ``Refused`` (Taps, dicts,
        tuples and lists of arrays keep their structure; a whole model's bare array is its logits)."""

        name = name or ("logits" if self.expected else "the output")
        if isinstance(out, Taps):
            for key in list(out):
                out[key] = self.leaf(str(key), out[key])
            if out.second is not None:
                self.portable(out.second, name)
            return out
        if isinstance(out, Mapping):
            return {k: self.portable(v, str(k)) for k, v in out.items()}
        if isinstance(out, (list, tuple)) and out and not _numeric_tree(out):
            items = [self.portable(v, name) for v in out]
            return tuple(items) if isinstance(out, tuple) else items
        return self.leaf(name, out)

    def leaf(self, name: str, value):
        if value is None or isinstance(value, (str, bool, Refused)):
            return value
        if isinstance(value, (list, tuple)):
            try:
                value = np.asarray(value, dtype=np.float64)
            except (ValueError, TypeError, OverflowError) as e:
                return Refused(f"{name} is a ragged or mixed list, not an array ({' '.join(str(e).split())[:200]})")
        elif isinstance(value, int) and not -(2**63) <= value < 2**64:  # crosses as JSON, read as no array
            return Refused(f"{name} is the integer {value!r:.60}, too large for any array dtype")
        if getattr(value, "dtype", None) == np.dtype(object):
            return Refused(f"{name} is an array of Python objects, not of numbers")
        shape = getattr(value, "shape", None)
        try:
            size = int(np.prod(shape)) if shape is not None else None
        except (TypeError, ValueError):
            size = None
        if size is not None and size > self.limit:
            expected = self.expected.get(name)
            what = f"the stage has {expected}" if expected else f"no stage of this config has more than {self.limit}"
            return Refused(
                f"{name} has shape {tuple(shape)} ({size:.3g} elements) where {what}: not materialised "
                f"(it would take {size * getattr(getattr(value, 'dtype', None), 'itemsize', 4) / 1e9:.3g} GB)"
            )
        return value


def packed_shape(name: str, config, batch: int, length: int) -> tuple[int, ...]:
    """The shape tap ``name`` has for a packed batch: every token axis as long as a padded row."""
    symbols = tap_symbols(config, batch, patches=length)
    return tuple(symbols[s] for s in stage_of(name)[0].shape.split())
