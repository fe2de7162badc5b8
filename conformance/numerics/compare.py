"""Compare a port's outputs with the float64 oracle, stage by stage, through the error model.

Every stage the port emits is judged twice: **locally** (the oracle's stage computed from the
port's own inputs to it, so one operation is judged at a time) where the port emits those
inputs, and **end to end** (against the oracle run from the images) with a bound that
propagates. A port's misbehaviour (a missing or mis-shaped tap, NaN, a wrong dtype) is a
finding with a one-line reason, never an exception.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from conformance.numerics.error_model import CaseModel, Chain, pool, stage_kind, stage_precision  # noqa: F401 - stage_kind re-exported
from conformance.numerics.mapped import let_go
from conformance.numerics.precision import DTYPES, rounded
from impls.stages import RESIDUAL
from conformance.numerics.precision import SIGNIFICAND_BITS as _BITS
from conformance.numerics.tolerances import end_to_end_tolerance, is_chaotic, tolerance
from impls.protocol import ViTConfig, tap_names, tap_shapes
from conformance.returned import as_taps


@dataclass
class StageResult:
    name: str
    max_abs_err: float | None
    rel_err: float | None  # max|port - oracle| / max|oracle|: for reading, not for the verdict
    ratio: float | None  # error over the error model's bound (local where the inputs were emitted)
    tol: float | None
    ok: bool
    reason: str = ""
    mode: str = "local"
    e2e_ratio: float | None = None  # max|port - oracle| / max|noisy oracle - oracle|
    e2e_tol: float | None = None
    stored: str | None = None  # the precision the stage was seen in (mixed precision: float32 under bfloat16)
    tokens: str | None = None  # a stage emitted for some of its tokens: which were compared
    chaotic: bool = False  # past the error model's linear regime end to end (tolerances.CHAOTIC)

    @property
    def separation(self) -> float:
        """How far over (> 1) or under its tolerance the stage is, the worse of both checks."""
        if self.ratio is None:
            return float("inf")
        worst = self.ratio / self.tol if self.tol else float("inf")
        if self.e2e_ratio is not None and self.e2e_tol:
            worst = max(worst, self.e2e_ratio / self.e2e_tol)
        return worst

    def to_dict(self) -> dict:
        return asdict(self)


def largest(x) -> float:
    """max |x| (NaN if any is), without an array of |x|."""
    x = np.asarray(x)
    return float(np.maximum(x.max(), -x.min())) if x.size else 0.0


def relative_spread(spread: float, expected) -> float:
    """The propagated spread over the stage's largest magnitude (tolerances.CHAOTIC): how far the
    error model's own runs move the stage, as a share of its range (``expected``: the stage, or
    its largest magnitude)."""
    scale = max(largest(expected), 0.0)
    if spread == 0:
        return 0.0
    return spread / scale if scale > 0 else float("inf")


def error(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(max abs error, max abs error over the largest |expected|)."""
    diff = np.subtract(actual, expected, dtype=np.float64)
    max_abs = largest(diff)
    scale = largest(expected)
    return max_abs, max_abs / max(scale, np.finfo(np.float64).tiny)


def _dtype_name(a) -> str:
    return str(getattr(a, "dtype", type(a).__name__)).rsplit(".", 1)[-1]


class Unreadable:
    """A value a port returned that is no array, as it came from the port's own process."""

    def __init__(self, why: str):
        self.why = why

    def __repr__(self) -> str:
        return f"Unreadable({self.why!r})"


def malformed(actual, shape, dtype: str = "float32") -> str | None:
    """Why ``actual`` cannot be a stage in ``dtype`` of this shape, or None."""
    if isinstance(actual, Unreadable):
        return actual.why
    if not isinstance(actual, np.ndarray):
        try:
            actual = np.asarray(actual)
        except Exception as e:  # a port may return anything
            return f"output is not an array: {type(actual).__name__} ({e})"
    if tuple(actual.shape) != tuple(shape):
        packed = len(shape) > 2 and shape[0] > 1 and actual.shape[:2] == (1, shape[0] * shape[1])
        hint = ": the batch's images in one sequence? ModelPort(sequence='one') reads such a tower" if packed else ""
        return f"shape {tuple(actual.shape)}, expected {tuple(shape)}{hint}"
    got = _dtype_name(actual)
    if got not in _BITS:
        return f"dtype {got}, expected {dtype}"
    if got != dtype:
        if _BITS[got] < _BITS[dtype]:
            return f"dtype {got}: lower precision than the {dtype} asked for"
        if dtype == "float32" or got == "float64":
            return f"dtype {got}, asked for {dtype}: a wider type hides the {dtype} rounding being checked"
        # bf16/fp16 returned as float32 (NumPy has no bfloat16): a stage in that dtype, or one the
        # port keeps in float32 (mixed precision: stored_as tells which).
    if not np.isfinite(np.asarray(actual, np.float64)).all():
        a = np.asarray(actual, np.float64)
        return f"non-finite values: {int(np.isnan(a).sum())} NaN, {int(np.isinf(a).sum())} Inf"
    return None


def stored_as(actual, dtype: str, emitted: str | None = None) -> str:
    """The precision a well-formed stage was stored in: the dtype asked for, or float32 where a
    port asked for bfloat16 or float16 keeps the stage in float32 (torch.autocast keeps LayerNorm
    and the residual stream there; Flax ``dtype``/``param_dtype``): never finer than float32,
    never coarser than asked. ``emitted``: the dtype the model emitted it in, where known."""
    if dtype == "float32":
        return "float32"
    if emitted == dtype:
        return dtype
    # A float32 tensor may still hold values rounded to the dtype (x.bfloat16().float()): the values
    # decide, and a float32 stage whose values all happen to be the dtype's is judged the looser way.
    a = np.asarray(actual)
    if _dtype_name(a) == dtype:
        return dtype
    finite = a[np.isfinite(a)]
    return dtype if np.array_equal(rounded(finite, dtype), finite) else "float32"


def token_subset(name: str, actual, shape, config: ViTConfig) -> tuple[int | None, str | None]:
    """A stage emitted for some of its tokens, as equivalent code computes it: the final norm
    applied to the class token only (CLIP/SigLIP-style towers, open_clip, many MLX ports) is the
    same as timm's norm-then-pool when the class token is what is pooled. (the token index compared,
    None) when ``actual`` is such a form, (None, why not) when it is the one-token form of a
    pooling it is not equivalent to, (None, None) otherwise."""
    if isinstance(actual, Unreadable):
        return None, None
    try:
        got = tuple(np.shape(actual))
    except (ValueError, TypeError):  # a ragged or mixed value: ``malformed`` says what it is
        return None, None
    if (
        name != "norm"
        or len(shape) != 3
        or got == tuple(shape)
        or got not in ((shape[0], shape[2]), (shape[0], 1, shape[2]))
    ):
        return None, None  # the whole stage (with one token, (B, 1, D) is the whole of it), or another shape
    if config.global_pool == "token" or shape[1] == 1:  # the class token pooled, or the only token
        return 0, None
    return None, (
        f"shape {got}: the final norm applied to one vector per image, but global_pool="
        f"{config.global_pool!r} pools the patch tokens after the norm (timm norms every token, then "
        "pools): normalising the pooled vector is another computation"
    )


def ratio_over_bound(err: np.ndarray, bound) -> float:
    """max over elements of err / bound (0 where err is 0): the error model's ratio."""
    return _ratio(np.array(err, np.float64), bound)


def _ratio(err: np.ndarray, bound) -> float:
    """``ratio_over_bound`` on a float64 ``err`` of the caller's own, divided in place (a full-size
    stage's temporaries are a few hundred megabytes each)."""
    np.divide(err, np.broadcast_to(np.asarray(bound, np.float64), err.shape), out=err, where=err > 0)
    return float(np.fmax.reduce(err, axis=None, initial=0.0))  # 0 stays 0; NaN (no error to rank) passed over


def _local_ratio(actual, value, bound, tiny: float) -> float:
    """``ratio_over_bound(|actual - value|, bound + tiny)``, |actual - value| made once."""
    err = np.subtract(actual, value, dtype=np.float64)
    return _ratio(np.abs(err, out=err), np.add(bound, tiny, dtype=np.float64))


def stage_ratios(
    name: str, actual, model: Chain, taps: Mapping, local: bool = True, precision=None, token: int | None = None
) -> dict:
    """The error of a well-formed stage: max abs and relative error against the oracle, the
    end-to-end ratio (over the propagated spread) and, if ``local``, the local ratio (over the
    unit bound of the stage computed from the port's own inputs, in ``precision``). ``token``:
    the stage was emitted for that token only (``actual`` is its (B, D) row)."""
    return stage_ratios_later(name, actual, model, taps, local, precision, token)()


def stage_ratios_later(
    name: str, actual, model: Chain, taps: Mapping, local: bool = True, precision=None, token: int | None = None
):
    """``stage_ratios`` in two steps: what reads the oracle now, in model order; what waits on the
    threads (a streamed case's local check and noisy runs) when the returned function is called,
    so that the next stages' clean steps go on meanwhile."""

    def rows(x):
        return x if token is None else np.asarray(x)[:, token]

    oracle = model.oracle[name]
    a = np.asarray(actual, np.float64).reshape(np.shape(rows(oracle)))
    max_abs, rel = error(a, rows(oracle))
    scale = largest(oracle)
    del oracle
    tiny = model.precision.tiny

    def local_ratio(inputs, tape=None) -> float:
        value, bound = model.local(name, inputs, precision, tape)
        return _local_ratio(a, rows(value), rows(np.broadcast_to(bound, np.shape(value))), tiny)

    ratio = None
    if local:  # the inputs read here (the port's mapped taps are let go after), the rest in a thread
        inputs = {k: np.asarray(taps[k], np.float64) for k in model.inputs(name)}
        ratio = pool().submit(local_ratio, inputs, model.tape(name)) if model.stream else local_ratio(inputs)
        del inputs

    def finish() -> dict:
        out = {"max_abs_err": max_abs, "rel_err": rel}
        if local:
            out["local"] = ratio if isinstance(ratio, float) else ratio.result()
        spread = model.spread(name)
        out["end-to-end"] = max_abs / spread if spread > 0 else (0.0 if max_abs == 0 else float("inf"))
        out["relative_spread"] = relative_spread(spread, scale)
        return out

    return finish


def compare_stage(*args, **kwargs) -> StageResult:
    """One emitted stage against the error model (``compare_stage_later``, its result at once)."""
    return compare_stage_later(*args, **kwargs)()


def compare_stage_later(
    name: str,
    actual,
    model: Chain,
    taps: Mapping,
    *,
    dtype: str = "float32",
    shape=None,
    valid: set | None = None,
    stored: Mapping[str, str] | None = None,
    token: int | None = None,
):
    """One emitted stage against the error model, in two steps (``stage_ratios_later``): the
    returned function gives its ``StageResult``. ``valid``: the taps that are well-formed;
    ``stored``: the precision each was seen in (default: the dtype asked for); ``token``: the
    stage was emitted for that token only."""
    kind = model.kind(name)
    shape = model.oracle[name].shape if shape is None else shape
    if token is not None:
        shape = (shape[0], shape[2])
        actual = np.asarray(actual).reshape(shape)
    reason = None if valid is not None and name in valid else malformed(actual, shape, dtype)
    local = model.can_check_locally(name, valid if valid is not None else taps)
    mode = "local" if local else "end-to-end"
    stored = stored or {}
    seen = stored.get(name, dtype)
    inputs = [stored.get(k, dtype) for k in model.inputs(name)] if local else []
    precision = stage_precision(kind, dtype, seen, inputs)
    tol = tolerance(kind, precision.dtype, mode)
    where = None if token is None else f"token {token} (the stage was emitted for it alone)"
    if reason:
        bad = float("inf") if reason.startswith("non-finite") else None
        result = StageResult(name, bad, bad, bad, tol, False, reason, mode, stored=seen, tokens=where)
        return lambda: result
    later = stage_ratios_later(name, actual, model, taps, local, precision, token)
    return lambda: _judged(name, kind, later(), local, mode, dtype, precision, tol, seen, where)


def _judged(name, kind, r: dict, local: bool, mode: str, dtype: str, precision, tol, seen, where) -> StageResult:
    chaotic = is_chaotic(r["relative_spread"])
    e2e, e2e_tol = r["end-to-end"], end_to_end_tolerance(kind, dtype, r["relative_spread"])
    ratio = r[mode]
    if not local:
        tol = end_to_end_tolerance(kind, precision.dtype, r["relative_spread"])
    ok = ratio <= tol and e2e <= e2e_tol
    why = ""
    if not ok:
        regime = (
            f"; chaotic here: the error model's own runs move it by {r['relative_spread']:.0%} of its range"
            if chaotic
            else ""
        )
        why = (
            f"error {ratio:.3g}x its bound > tol {tol:.3g} ({'local' if local else 'end to end' + regime})"
            if ratio > tol
            else f"end to end: error {e2e:.3g}x the propagated bound > tol {e2e_tol:.3g}{regime}"
        )
    return StageResult(
        name, r["max_abs_err"], r["rel_err"], ratio, tol, ok, why, mode, e2e, e2e_tol, seen, where, chaotic
    )


# Precision policies for --dtype bfloat16 / float16 (``verify --policy``): what a stage may be
# stored in. "mixed" (the default): the dtype asked for or float32, each stage judged as stored.
# "autocast": as torch.autocast runs a ViT: contractions in the dtype asked for, LayerNorm's
# output and the residual stream in float32 (a float32 stage elsewhere is still allowed: more
# precise); a stage of those kinds in the lower dtype is a finding. "uniform": every stage in the
# dtype asked for (a port that should run entirely in it).
POLICIES = ("mixed", "autocast", "uniform")
_BEHIND = 1  # stages compare_outputs takes each result behind: the error model's runs stay within it
AUTOCAST_FLOAT32 = RESIDUAL  # the residual stream and the LayerNorms of it (impls.stages)


def policy_finding(name: str, kind: str, stored: str, dtype: str, policy: str, config: ViTConfig) -> str | None:
    """Why a stage stored in ``stored`` breaks the precision ``policy``, or None."""
    if dtype == "float32" or policy == "mixed":
        return None
    if policy == "uniform" and stored != dtype:
        return f"stored in {stored} where the policy 'uniform' asks every stage in {dtype}"
    f32 = kind in AUTOCAST_FLOAT32 or (kind == "pooled" and config.global_pool != "map")
    if policy == "autocast" and f32 and stored == dtype:
        return (
            f"stored in {dtype}, where torch.autocast keeps LayerNorm's output and the residual stream in "
            "float32 (--policy autocast)"
        )
    return None


class _Pass:
    """One pass of a port's outputs prepared for judging: which stages it emitted, which are
    well-formed, the precision each was stored in, and what each refused one is refused for."""

    def __init__(self, out, model: CaseModel, shapes: Mapping, dtype: str, policy: str):
        config: ViTConfig = model.config
        self.out, self.model, self.shapes, self.dtype = out, model, shapes, dtype
        self.names = [n for n in tap_names(config) if n in out]
        emitted = as_taps(out).dtypes
        refused, tokens, valid, stored = {}, {}, set(), {}
        for n in self.names:  # a stage at a time: each read once here and let go
            a = out[n]
            token, why = token_subset(n, a, shapes[n], config)
            if token is not None:
                tokens[n] = token
            if not why and _BITS.get(emitted.get(n), 99) < _BITS[dtype]:  # as the model emitted it
                why = f"emitted in {emitted[n]}: lower precision than the {dtype} asked for"
            if why:
                refused[n] = why
            else:
                shape = (shapes[n][0], shapes[n][2]) if token is not None else shapes[n]
                if malformed(np.reshape(a, shape) if token is not None else a, shape, dtype) is None:
                    valid.add(n)
                    stored[n] = stored_as(a, dtype, emitted.get(n))
            let_go(a)
        for n in sorted(valid):
            why = policy_finding(n, model.kind(n), stored[n], dtype, policy, config)
            if why:
                refused[n] = why
                valid.discard(n)
        self.refused, self.tokens, self.valid, self.stored = refused, tokens, valid, stored
        # Downstream stages read a one-token stage's full tensor: the rows the port computed, the
        # oracle's elsewhere (they feed nothing the config pools).
        widened = {n: t for n, t in tokens.items() if n in valid}
        self.taps = _Widened(out, widened, model) if widened else out

    def compare(self, n: str):
        """Stage ``n`` judged in two steps (``compare_stage_later``): the returned function gives
        its result, the port's taps it read let go then."""
        if n in self.refused:
            result = StageResult(
                n,
                None,
                None,
                None,
                tolerance(self.model.kind(n), self.dtype, "local"),
                False,
                self.refused[n],
                stored=self.stored.get(n),
            )
            return lambda: result
        later = compare_stage_later(
            n,
            self.out[n],
            self.model,
            self.taps,
            dtype=self.dtype,
            shape=self.shapes[n],
            valid=self.valid,
            stored=self.stored,
            token=self.tokens.get(n),
        )

        def result() -> StageResult:
            done = later()
            let_go(*(self.out[k] for k in (n, *self.model.inputs(n)) if k in self.out))
            return done

        return result


def compare_outputs(
    out,
    model: CaseModel,
    *,
    batch: int | None = None,
    dtype: str = "float32",
    policy: str = "mixed",
    also=(),
) -> list[StageResult]:
    """Every stage the port emitted, in model order, against the error model of its case.

    ``out`` is what a port's forward returned: the logits, or a dict with "logits" and taps.
    ``policy``: which storage precisions are allowed per stage (``POLICIES``). ``also``: other
    passes of the same forward (a captured model's second pass), each stage judged beside the
    first's, so that a streamed oracle is read once, in model order.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    config: ViTConfig = model.config
    shapes = tap_shapes(config, model.images.shape[0] if batch is None else batch, model.images.shape[2:])
    passes = [_Pass(o if isinstance(o, Mapping) else {"logits": o}, model, shapes, dtype, policy) for o in (out, *also)]
    # Each stage's result taken a stage later: a streamed case's next clean step goes on while the
    # threads finish its local check and noisy runs.
    results, behind = [], deque()
    for n in tap_names(config):
        for p in passes:
            if n in p.names:
                behind.append(p.compare(n))
                if len(behind) > _BEHIND:
                    results.append(behind.popleft()())
    results += [later() for later in behind]
    if "logits" not in passes[0].out and "logits" not in as_taps(out).unseen:
        results.append(
            StageResult(
                "logits",
                None,
                None,
                None,
                tolerance("logits", dtype, "end-to-end"),
                False,
                "the port returned no 'logits'",
                "end-to-end",
            )
        )
    return results


class _Widened(Mapping):
    """``out`` with each one-token stage widened to its full (B, N, D) as it is read: the emitted
    row at its token, the oracle's rows elsewhere (they feed nothing the config pools)."""

    def __init__(self, out: Mapping, tokens: Mapping[str, int], model: CaseModel):
        self._out, self._tokens, self._model = out, tokens, model

    def __getitem__(self, name: str):
        if name not in self._tokens:
            return self._out[name]
        row = np.asarray(self._out[name], np.float64).reshape(self._out[name].shape[0], -1)
        wide = np.array(self._model.oracle[name], np.float64)
        wide[:, self._tokens[name]] = row
        return wide

    def __iter__(self):
        return iter(self._out)

    def __len__(self) -> int:
        return len(self._out)


def first_divergence(results: list[StageResult]) -> str | None:
    return next((r.name for r in results if not r.ok), None)


def describe_failures(results: list[StageResult], port: str, **context) -> str:
    """A report naming the port, each failing stage (at most 8) with its errors, and the drawn case."""
    failing = [r for r in results if not r.ok]
    lines = [f"port {port!r} diverges from the float64 oracle; first divergent stage: {first_divergence(results)}"]
    for r in failing[:8]:
        if r.max_abs_err is None or r.ratio is None or not np.isfinite(r.ratio):
            lines.append(f"  {r.name}: {r.reason}")
        else:
            lines.append(f"  {r.name}: max_abs_err {r.max_abs_err:.3e}, rel_err {r.rel_err:.3e}; {r.reason}")
    if len(failing) > 8:
        lines.append(f"  ... and {len(failing) - 8} later stages")
    for key, value in context.items():
        lines.append(f"  {key}: {value}")
    return "\n".join(lines)
