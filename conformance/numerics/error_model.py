"""The error model: for every stage, how far a correct port's rounding can move each element.

Each stage is evaluated in float64 from its **inputs** (by default the port's own taps, so a
stage is judged on the one operation it performs and errors do not compound across blocks),
together with a per-element **unit bound**: the rounding a correct implementation commits
there, built from the computation at hand,

* a contraction of length K over magnitudes a_k b_k (a Linear, the patch conv, q·k, P·v):
  ``u_c √K √(Σ a_k² b_k²) + u_s (|y| + √(Σ a_k² b_k²))`` (accumulation in the compute
  precision, inputs, weights and output rounded to the storage precision);
* a LayerNorm of a token with mean μ, spread σ and rms = √(μ² + σ²):
  ``u_c √D |γ| (rms/σ + |x̂|) + u_s (|y| + |γ x̂| + |β|)``: the mean and variance lose
  u·rms, which the normalisation divides by σ, so a token whose mean is large against its
  spread (trained ViTs' high-norm tokens) is ill-conditioned, and the bound says so;
* a softmax over logits l with row maximum m: each logit may be off by
  ``E = u_c (√hd A + |l − m| + 1) + u_s (|l| + A)`` (A = scale √(q² · k²) the magnitude of
  the logit's sum), which moves its weight by a factor up to exp(E) and the normaliser by
  up to exp(Ē), Ē = log Σ P exp(E): bound ``P expm1(E + Ē)`` (``P (E + Σ P E)`` to first
  order, at most 1); large logits loosen it, as they must;
* GELU: ``|gelu'(h)|`` times the bound of its input, plus ``u_s (|a| + |h|)``;
* a sum (residual, position embedding): ``u_s (|a| + |b|)``.

``u_s`` is the unit roundoff of the port's dtype and ``u_c`` that of float32 (what every
framework accumulates and keeps LayerNorm and softmax statistics in for bf16/fp16).

A stage's **ratio** is ``max_i |port_i − oracle_i| / unit_bound_i``; tolerances.py holds the
largest ratio calibrated on correct ports per stage kind and dtype, times a margin.

A stage whose inputs the port does not emit (a port that returns only logits) is judged end
to end: the bound then **propagates**, estimated by running the whole chain in float64 with
each stage perturbed by Gaussian noise of its unit bound (``noisy_runs`` draws); the stage's
end-to-end ratio is ``max|port − oracle| / max|noisy − oracle|``.

The clean run and the noisy runs go in step, a stage at a time (``_Runs``): a small model's
are held for every port that reads them; a full-size case's (``stream=True``) are computed as
the comparison reads them in model order and let go, in threads (``pool``), so that what a
case holds is a block's stages, not the model's. There the noisy runs and the local checks
follow the clean step's large contractions and activations (``Tape``): a local bound is then at
most ``NEARBY`` (1/32) looser than one computed afresh from the port's inputs, and is computed
afresh wherever it would be looser.

The module holds the chain (``Chain``: ``CaseModel`` for a whole model, ``AttentionModel`` for
an attention port); each stage kind's value and bound is in ``conformance.numerics.kinds``
(``linear``, ``layer_norm``, ``activation``, ``attention``), the ViT's stages composed of them in
``evaluate``, the runs in step in ``runs``, the clean step's tape in ``tape`` and a stage's
roundings in ``roundings``; the names the rest of the project uses are imported here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import nullcontext

import numpy as np

from conformance.numerics.evaluate import attend_and_project, evaluate, mlp_hidden, prefix_tokens  # noqa: F401 - the API
from conformance.numerics.kinds.activation import CURVATURE, activation  # noqa: F401 - the API
from conformance.numerics.kinds.attention import attend, sdpa, softmax_weights  # noqa: F401 - the API
from conformance.numerics.kinds.layer_norm import layer_norm  # noqa: F401 - the API
from conformance.numerics.kinds.linear import linear
from conformance.numerics.mapped import let_go
from conformance.numerics.precision import SMALLEST_NORMAL  # noqa: F401 - the API
from conformance.numerics.roundings import Precision, stage_precision  # noqa: F401 - the API
from conformance.numerics.runs import BeyondRange, _Runs, parallel, pool  # noqa: F401 - the API
from conformance.numerics.tape import NEARBY, Tape, squares  # noqa: F401 - the API
from impls import numpy_vit as O
from impls.protocol import ViTConfig, tap_names, tap_shapes
from impls.stages import CONTRACTIONS, stage_inputs, stage_kind  # noqa: F401 - re-exported


class _Oracle(Mapping):
    """A chain's clean run as a mapping of its stages (``_Runs``)."""

    def __init__(self, runs: _Runs):
        self._runs = runs

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._runs.chain.names:
            raise KeyError(name)
        return self._runs.value(name)

    def __iter__(self):
        return iter(self._runs.chain.names)

    def __len__(self) -> int:
        return len(self._runs.chain.names)


class Chain:
    """A computation as named stages, each evaluated from earlier ones with its unit bound.

    ``oracle`` is the clean run; ``local`` a stage from the port's own inputs; ``spread`` the
    propagated bound's scale, from runs with every stage perturbed by N(0, unit bound²).
    ``stream``: the clean run is computed as it is read, in model order, and not held (``_Runs``)."""

    names: tuple[str, ...] = ()

    def __init__(
        self, precision: Precision | str = "float32", noisy_runs: int = 2, seed: int = 0, stream: bool = False
    ):
        self.precision = Precision(precision) if isinstance(precision, str) else precision
        self.noisy_runs, self.seed, self.stream = noisy_runs, seed, stream
        self._runs: _Runs | None = None
        self._last_readers: dict[str, int] | None = None

    def _run(self) -> _Runs:
        if self._runs is None:
            self._runs = _Runs(self, held=not self.stream)
        return self._runs

    @property
    def oracle(self) -> Mapping[str, np.ndarray]:
        """The clean run, each stage computed on first use (a local check alone needs none)."""
        return _Oracle(self._run())

    def inputs(self, name: str) -> tuple[str, ...]:
        raise NotImplementedError

    def last_readers(self) -> dict[str, int]:
        """Each stage's place, in model order, of the last stage that reads it (or its own): what
        a run going in model order may let go once past it (worked out once: every fit reads it)."""
        if self._last_readers is None:
            last = {n: i for i, n in enumerate(self.names)}
            for i, n in enumerate(self.names):
                for k in self.inputs(n):
                    last[k] = max(last.get(k, i), i)
            self._last_readers = last
        return dict(self._last_readers)

    def evaluate(self, name: str, t: Mapping[str, np.ndarray], precision: Precision | None = None):
        """(value, unit bound) of stage ``name`` from its inputs ``t``, in ``precision`` (default:
        the chain's)."""
        raise NotImplementedError

    def evaluate_runs(self, name: str, t: Mapping[str, np.ndarray], runs: int, precision: Precision):
        """The value of ``name`` for ``runs`` runs at once, each input of ``t`` the runs' values
        stacked along the batch axis (run r's batch r-th), or None where the chain cannot (each
        run is then evaluated on its own). Every stage computes each image on its own, so a
        stacked batch is the runs side by side: one call instead of one per run (``_Runs``)."""
        return None

    def sizes(self) -> dict[str, int]:
        """Each stage's number of elements (before anything is computed)."""
        raise NotImplementedError

    def kind(self, name: str) -> str:
        """The stage kind whose calibrated tolerance applies."""
        raise NotImplementedError

    def local(
        self, name: str, taps: Mapping[str, np.ndarray], precision: Precision | None = None, tape: Tape | None = None
    ):
        """(oracle value, unit bound) of ``name`` computed from the port's own inputs ``taps``, in
        ``precision`` (default: the chain's; mixed precision: the stage's as emitted). ``tape``:
        the clean step's, followed where the port's inputs are near the oracle's (``Tape``)."""
        t = {k: np.asarray(taps[k], np.float64) for k in self.inputs(name)}
        with tape.following() if tape is not None else nullcontext():
            return self.evaluate(name, t, precision)

    def beyond_range(self) -> str | None:
        """Why no port can represent this case in its dtype (the oracle reaches half the dtype's
        largest finite value somewhere: judging it would be a false alarm), or None. Streamed, it
        is found as the run reaches it: reading the oracle then raises ``BeyondRange``."""
        if self.stream:
            return None
        runs = self._run()
        runs.finish()
        if runs.largest > runs.limit:
            return f"the oracle reaches {runs.largest:.3g}, beyond {self.precision.dtype}'s range"
        return None

    def settle(self) -> None:
        """The rest of the run, where the comparison did not read it (``BeyondRange`` if it is)."""
        self._run().finish()

    def can_check_locally(self, name: str, taps) -> bool:
        return all(k in taps for k in self.inputs(name))

    def spread(self, name: str) -> float:
        """max |noisy − oracle| at ``name`` over the noisy runs (``_Runs``)."""
        return self._run().spread_of(name)

    def tape(self, name: str) -> Tape | None:
        """A streamed run's tape of ``name``'s clean step, where it is the last one (``local``
        follows it)."""
        return self._run().tapes.get(name) if self.stream else None


class _Float64(Mapping):
    """A state's arrays in float64 as each is read: a full-size model's weights are not held
    twice (float32 and float64) for the length of a case."""

    def __init__(self, state: Mapping[str, np.ndarray]):
        self._state = state

    def __getitem__(self, key: str) -> np.ndarray:
        weight = self._state[key]
        try:
            return np.asarray(weight, np.float64)
        finally:
            let_go(weight)  # mapped from the file written for the port: not resident past the copy

    def __iter__(self):
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)


class CaseModel(Chain):
    """The error model of one whole-model case: config, canonical state, images, dtype.
    ``stream``: the oracle is computed as compare reads it and let go (a full-size case)."""

    def __init__(
        self,
        config: ViTConfig,
        state: Mapping[str, np.ndarray],
        images: np.ndarray,
        precision: Precision | str = "float32",
        noisy_runs: int = 2,
        seed: int = 0,
        stream: bool = False,
    ):
        super().__init__(precision, noisy_runs, seed, stream)
        self.config = config
        self.images = np.asarray(images)
        # small models: float64 once (read by every stage of up to eight noisy runs); full size: as used
        small = sum(np.size(v) for v in state.values()) < 4e6
        self._s = {k: np.asarray(v, np.float64) for k, v in state.items()} if small else _Float64(state)
        self._x = np.asarray(images, np.float64)
        self.names = tuple(tap_names(config))
        # read for every stage of every noisy run and fit: looked up here, not through the config's hash
        self._inputs = {n: stage_inputs(n, config) for n in self.names}
        self._tiled: tuple[int, np.ndarray | None] = (0, None)  # (runs, the images once per run)

    def inputs(self, name):
        return self._inputs[name] if name in self._inputs else stage_inputs(name, self.config)

    def evaluate(self, name, t, precision=None):
        return evaluate(name, t, self._x, self._s, self.config, precision or self.precision)

    def evaluate_runs(self, name, t, runs, precision):
        if self._tiled[0] != runs:
            self._tiled = (runs, np.concatenate([self._x] * runs))
        return evaluate(name, t, self._tiled[1], self._s, self.config, precision)[0]

    def hidden(self, name, taps, dtype: str = "float64"):
        """fc1's output in float64 at a plain MLP's activation stage, from the port's inputs and fc1's
        weights rounded to ``dtype`` (None elsewhere): the activation's input before the port rounds it."""
        t = {k: taps[k] for k in self.inputs(name) if k in taps}
        return mlp_hidden(name, t, self._s, self.config, dtype) if len(t) == len(self.inputs(name)) else None

    def sizes(self):
        shapes = tap_shapes(self.config, self.images.shape[0], self.images.shape[2:])
        return {name: math.prod(shapes[name]) for name in self.names}

    def kind(self, name):
        return stage_kind(name)


ATTENTION_STAGES = ("attn.q", "attn.k", "attn.v", "attn.weights", "attn")


class AttentionModel(Chain):
    """The error model of a standalone (cross-)attention: q from x, k and v from the context
    (timm's AttentionPoolLatent weights ``q``, ``kv``, ``proj``), an optional mask."""

    names = ATTENTION_STAGES

    def __init__(
        self,
        options: Mapping,
        state: Mapping[str, np.ndarray],
        x,
        context=None,
        mask=None,
        precision: Precision | str = "float32",
        noisy_runs: int = 2,
        seed: int = 0,
    ):
        super().__init__(precision, noisy_runs, seed)
        self.options = dict(options)
        self._s = {k: np.asarray(v, np.float64) for k, v in state.items()}
        self._x = np.asarray(x, np.float64)
        self._ctx = self._x if context is None else np.asarray(context, np.float64)
        self._mask = mask

    def inputs(self, name):
        return {
            "attn.q": (),
            "attn.k": (),
            "attn.v": (),
            "attn.weights": ("attn.q", "attn.k"),
            "attn": ("attn.weights", "attn.v"),
        }[name]

    def kind(self, name):
        return "mha." + name.split(".", 1)[1] if "." in name else "mha.out"

    def evaluate(self, name, t, precision=None):
        o, s, p = self.options, self._s, precision or self.precision
        H = o["num_heads"]
        hd = o.get("head_dim") or o["dim"] // H
        inner = H * hd
        if name == "attn.q":
            y, bound = linear(self._x, s["q.weight"], s.get("q.bias"), p)
        elif name in ("attn.k", "attn.v"):
            rows = slice(0, inner) if name == "attn.k" else slice(inner, 2 * inner)
            bias = s.get("kv.bias")
            y, bound = linear(self._ctx, s["kv.weight"][rows], None if bias is None else bias[rows], p)
        elif name == "attn.weights":
            return softmax_weights(t["attn.q"], t["attn.k"], hd**-0.5, p, self._mask)
        else:
            return attend_and_project(t["attn.weights"], t["attn.v"], s, "proj", p)
        return O.split_heads(y, H), O.split_heads(bound, H) if p.bounds else 0.0

    def sizes(self):
        o = self.options
        H = o["num_heads"]
        hd = o.get("head_dim") or o["dim"] // H
        (B, Nq), Nk = self._x.shape[:2], self._ctx.shape[1]
        return {
            "attn.q": B * H * Nq * hd,
            "attn.k": B * H * Nk * hd,
            "attn.v": B * H * Nk * hd,
            "attn.weights": B * H * Nq * Nk,
            "attn": B * Nq * self._s["proj.weight"].shape[0],
        }
