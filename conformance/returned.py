"""What a port returns, as one declared type: ``Taps``, stage -> array, with what capture knows
about the run beside them (a quantized port's weights as ``Quantized``). capture builds it
whole, the sandbox carries it across processes (conformance.sandbox.wire), and the checks read
it by attribute; a factory port's plain dict (or bare logits) is read through ``as_taps``, with
nothing beside its arrays."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


class Taps(dict):
    """What a captured forward returns: stage -> array, plus what it could not see and the
    findings of the load (``unseen``: stage -> reason; ``findings``: (stage, reason))."""

    def __init__(self, *args, unseen=None, findings=(), sources=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.unseen: dict[str, str] = dict(unseen or {})
        self.findings: list[tuple[str, str]] = list(findings)
        self.sources: dict[str, str] = dict(sources or {})
        self.dtypes: dict[str, str] = {}  # stage -> the dtype the model emitted it in (before any cast to NumPy)
        # A second pass off the model's own path (a fused kernel's internals read where a function
        # mode moves it onto another path): judged too, its stages named in ``sources``.
        self.second: Taps | None = None
        self.from_second: set[str] = set()  # stages here that only the second pass showed
        self.quantized: Quantized | None = None  # a quantized port's weights as its kernels compute with them
        self.path: str | None = None  # how a compiled model's call ran (compiled, compiled again, eager)

    def own_pass(self) -> "Taps":
        """The stages read on the model's own path alone (a stage's local check then never takes
        its inputs from another pass)."""
        if not self.from_second:
            return self
        own = Taps(
            {k: v for k, v in self.items() if k not in self.from_second},
            unseen=self.unseen,
            findings=self.findings,
            sources=self.sources,
        )
        own.dtypes = {k: v for k, v in self.dtypes.items() if k not in self.from_second}
        own.quantized, own.path = self.quantized, self.path
        return own


def as_taps(out) -> Taps:
    """``out`` as ``Taps``: itself, a factory port's dict of stages (shallow: the same arrays), or
    a bare array as the logits (a port may return only those)."""
    if isinstance(out, Taps):
        return out
    return Taps(out) if isinstance(out, Mapping) else Taps({"logits": out})


@dataclass
class Quantized:
    """A quantized port's weights in the canonical names and layouts (``ModelPort(quantize=)``):
    ``values`` each quantized parameter as its kernel computes with it (float64), ``steps`` each
    entry's half step (0 where the entry is not quantized), ``reach`` each entry's
    ``QuantizedWeight.reach`` (its |value| where not quantized), ``what`` how, in words."""

    values: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    reach: dict[str, np.ndarray]
    what: str
    named: dict[str, str] = field(default_factory=dict)  # key -> the bug its stored weight shows (explain)
    input_levels: dict[str, int] = field(default_factory=dict)  # key -> QuantizedWeight.input_levels, where set
    coarse: dict[str, float] = field(default_factory=dict)  # key -> its grid's scale over the format's, where above 1

    PARTS = ("values", "steps", "reach")
