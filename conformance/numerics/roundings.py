"""The roundings a stage commits (``Precision``), and a stage's read from what the port emitted."""

from __future__ import annotations

from dataclasses import dataclass
from conformance.numerics.precision import DTYPES, SMALLEST_NORMAL, UNIT_ROUNDOFF, coarsest
from impls.stages import CONTRACTIONS, stage_inputs, stage_kind  # noqa: F401 - re-exported


@dataclass(frozen=True)
class Precision:
    """The roundings a stage commits: ``dtype`` its operands and weights are stored in,
    ``output_dtype`` its output (mixed precision: a stage emitted in float32 when the port runs
    in bfloat16), ``input_dtype`` its input taps' (a port may hold a summand more precisely than
    its tap shows); both default to ``dtype``, as in a port that computes in one dtype."""

    dtype: str = "float32"
    output_dtype: str | None = None
    input_dtype: str | None = None
    bounds: bool = True  # False: the values alone, every bound 0 (a noisy run's: it is perturbed by the clean run's)
    # what sums are accumulated in (default float32, as every framework's float matmul; MLX's CPU
    # quantized_matmul accumulates in its inputs' dtype: conformance.verify.quantized)
    accumulate: str | None = None
    # a contraction's input quantized at run time per tensor to this many steps (torch.ao's dynamic
    # int8 Linear: conformance.numerics.kinds.linear)
    input_levels: int | None = None

    def __post_init__(self):
        for d in (
            self.dtype,
            self.output_dtype or self.dtype,
            self.input_dtype or self.dtype,
            self.accumulate or self.dtype,
        ):
            if d not in UNIT_ROUNDOFF:
                raise ValueError(f"dtype must be one of {DTYPES}, got {d!r}")

    @property
    def storage(self) -> float:
        return UNIT_ROUNDOFF[self.dtype]

    @property
    def output(self) -> float:
        return UNIT_ROUNDOFF[self.output_dtype or self.dtype]

    @property
    def inputs(self) -> float:
        return UNIT_ROUNDOFF[self.input_dtype or self.dtype]

    @property
    def compute(self) -> float:
        if self.accumulate:
            return UNIT_ROUNDOFF[self.accumulate]
        return UNIT_ROUNDOFF["float64" if self.dtype == "float64" else "float32"]

    @property
    def tiny(self) -> float:
        """Below this a weight may flush to zero (XLA and fp16 flush subnormals)."""
        return SMALLEST_NORMAL[self.dtype]


def stage_precision(kind: str, asked: str, output: str, inputs=()) -> Precision:
    """A stage's roundings from what the port emitted: ``output`` the stage's storage as seen,
    ``inputs`` its input taps' (the coarsest counts). A stage emitted in the dtype asked for is
    judged as a port computing in that dtype; one emitted in float32 (mixed precision) has float32
    roundings, but for a contraction's operands, which may still be in the dtype asked for."""
    if output == asked:
        return Precision(asked)
    operands = asked if kind in CONTRACTIONS else output
    return Precision(operands, output_dtype=output, input_dtype=coarsest(inputs) if inputs else operands)
