"""The clean run and the noisy runs in step, a stage at a time: held for a small model, streamed in
threads (``pool``) for a full-size one."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol
from functools import lru_cache
import numpy as np
from conformance.numerics.precision import LARGEST
from impls.stages import CONTRACTIONS, stage_inputs, stage_kind  # noqa: F401 - re-exported
from conformance.numerics.tape import Tape
from concurrent.futures import ThreadPoolExecutor


class Stages(Protocol):
    """What the runs read of the computation they run (error_model's ``Chain``): its stages in order,
    each evaluated alone or over the noisy runs, who reads what last, the sizes, the precision,
    how many noisy runs and their seed."""

    names: tuple[str, ...]
    precision: Any
    noisy_runs: int
    seed: int

    def last_readers(self) -> dict: ...

    def sizes(self) -> dict: ...

    def evaluate(self, name, t, precision=None): ...

    def evaluate_runs(self, name, t, runs, precision): ...


class BeyondRange(Exception):
    """A streamed case's oracle reached beyond the dtype's range (found as the run reached it):
    the case is not judged (``Chain.beyond_range``)."""


@lru_cache(maxsize=1)
def pool():
    """Threads for a streamed case's work beside the clean run (each noisy run's steps, the local
    checks): NumPy runs its elementwise functions and random draws on one core. A task waits at
    most on one submitted before it (a noisy run's step before), so on one running or done; more
    threads than cores, as a few wait. Run them under ``parallel()``."""

    return ThreadPoolExecutor(max_workers=6, thread_name_prefix="error-model")


@lru_cache(maxsize=1)
def beside():
    """A thread for a part of a streamed clean step, beside the rest of it (its tasks wait on nothing)."""

    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="clean-step")


def parallel():
    """NumPy's BLAS on one core per call while the pool's threads run: several BLAS calls at once,
    each on all cores, contend (OpenBLAS's threads spin), where one core each does not."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


@lru_cache(maxsize=16)
def _skipped(seed: int, draws: int, runs: int = 1) -> tuple[dict, ...]:
    """The states of ``default_rng(seed)`` after r x ``draws`` standard normals, r = 1 .. ``runs``,
    drawn once (a normal takes a varying number of the generator's words, so the only way there is
    to draw them)."""
    rng, chunk, states = np.random.default_rng(seed), np.empty(1 << 20), []
    for _ in range(runs):
        left = draws
        while left > 0:
            n = min(left, chunk.size)
            rng.standard_normal(out=chunk[:n])
            left -= n
        states.append(rng.bit_generator.state)
    return tuple(states)


class _Runs:
    """The clean run and the noisy runs of a chain, a stage at a time.

    A noisy run perturbs every stage's value, computed from that run's own inputs, by
    N(0, bound²), the bound the clean run derived there (it differs from the noisy inputs' own by
    the inputs' relative perturbation, of the dtype's roundoff: a value alone is a third of the
    cost of a value with its bound). Run r draws from one generator where run r − 1 stops, as if
    the runs went one after another. ``held``: every stage's clean value is kept (a small model's
    case, read by many ports and in any order), each step's noisy runs done with it; otherwise
    each clean value is let go once the stages that read it are past (a full-size case's oracle is
    never whole in memory: read it in model order), and each noisy run goes on in the pool a step
    behind the clean run, its steps one after another, at most ``BEHIND`` steps behind (what they
    hold: those steps' tapes and bounds)."""

    BEHIND = 2

    def __init__(self, chain: Stages, held: bool):
        self.chain, self.held = chain, held
        self.last = chain.last_readers()
        sizes = chain.sizes()
        total = sum(sizes.values())
        # At least ``noisy_runs``, and up to 8 on small models, so that a stage of a few elements (the
        # logits of one image) is not judged by the luck of two draws (the largest of 8 |N(0, 1)| is
        # below 0.3 once in 10⁵).
        self.runs = max(chain.noisy_runs, min(8, int(4e6 // max(total, 1))))
        # run r's generator where run r - 1's stops; streamed, skipped there in the pool while the
        # first clean step runs (a full-size case's skip is tens of millions of draws)
        self.rngs = [np.random.default_rng(chain.seed)]
        # ``skipped()``: the other runs' generator states, at the first step
        if held:  # one run's draws after another's
            states = _skipped(chain.seed, total, self.runs - 1)
            self.skipped = lambda: states
        else:  # or side by side in the pool
            futures = [pool().submit(_skipped, chain.seed, r * total) for r in range(1, self.runs)]
            self.skipped = lambda: [f.result()[0] for f in futures]
        self.done = 0  # stages computed, in model order
        self.clean: dict[str, np.ndarray] = {}
        self.noisy: list[dict[str, np.ndarray]] = [{} for _ in range(self.runs)]
        # held: the runs' stages stacked along the batch axis (``_stacked_step``), while the chain can
        self.stacked: dict[str, np.ndarray] | None = {} if held else None
        self.spread: dict[str, float] = {}
        self.pending: dict[str, list] = {}  # streamed: each step's noisy runs in the pool, oldest first
        self.tapes: dict[str, Tape] = {}  # streamed: the last step's tape, for its local check to follow
        self.largest = 0.0
        self.limit = LARGEST["float16" if chain.precision.dtype == "float16" else "float32"] / 2

    def value(self, name: str) -> np.ndarray:
        names = self.chain.names
        if name not in self.clean:
            if names.index(name) < self.done:
                raise KeyError(f"stage {name!r} was let go: a streamed oracle is read in model order")
            while self.done <= names.index(name):
                self._step()
        return self.clean[name]

    def spread_of(self, name: str) -> float:
        if name not in self.spread and name not in self.pending:  # not reached yet (or let go: raises)
            self.value(name)
        while name not in self.spread:
            self._settle_oldest()
        return self.spread[name]

    def finish(self) -> None:
        while self.done < len(self.chain.names):
            self._step()
        while self.pending:
            self._settle_oldest()

    def _step(self) -> None:
        while len(self.pending) >= self.BEHIND:
            self._settle_oldest()
        chain, i = self.chain, self.done
        name = chain.names[i]
        tape = Tape()
        with tape.recording():
            value, bound = chain.evaluate(name, self.clean)
        value = np.asarray(value, np.float64)
        self.largest = max(self.largest, float(np.abs(value).max(initial=0.0)))
        if not self.held and self.largest > self.limit:
            raise BeyondRange(f"the oracle reaches {self.largest:.3g}, beyond {chain.precision.dtype}'s range")
        bound = np.broadcast_to(bound, value.shape)
        quiet = replace(chain.precision, bounds=False)
        let_past = [k for k in self.last if self.last[k] <= i]  # no stage after this one reads them

        def perturbed(r: int, before=None) -> float:
            """Run r's value from its own inputs, following the clean step, perturbed (each run its
            own generator: the same draws in any order), once its step before is done."""
            if before is not None:
                before.result()
            with tape.following():
                v = np.asarray(chain.evaluate(name, self.noisy[r], quiet)[0], np.float64)
            noise = self.rngs[r].standard_normal(v.shape)
            noise *= bound
            v = np.add(v, noise, out=noise)  # v + noise x bound, in the draws' array
            self.noisy[r][name] = v
            spread = float(np.abs(v - value).max(initial=0.0))
            for k in let_past:
                self.noisy[r].pop(k, None)
            return spread

        runs = range(self.runs)
        if self.skipped is not None:  # the first step: the other runs' generators, once skipped there
            for state in self.skipped():
                rng = np.random.default_rng(chain.seed)
                rng.bit_generator.state = state
                self.rngs.append(rng)
            self.skipped = None
        self.clean[name] = value
        self.done = i + 1
        if self.held:
            stacked = self._stacked_step(name, value, bound, quiet, let_past, tape)
            self.spread[name] = max(map(perturbed, runs)) if stacked is None else stacked
            return
        # Each run's step after its step before, in the pool: FIFO, so a step waits only on one
        # already running or done. Beside them the clean run goes on, and what reads it.
        before = list(self.pending.values())[-1] if self.pending else [None] * self.runs
        self.pending[name] = [pool().submit(perturbed, r, before[r]) for r in runs]
        self.tapes = {name: tape}  # the comparison takes it for the local check as it reads the value
        for k in [k for k in self.clean if self.last[k] < i]:  # past their last reader and their own step
            del self.clean[k]

    def _stacked_step(self, name, value, bound, quiet, let_past, tape) -> float | None:
        """A held step's noisy runs in one evaluation, their stages stacked along the batch axis
        (``Chain.evaluate_runs``): the same values and draws as run by run (each run's noise from
        its own generator, in stage order), the largest spread over the runs. None where the
        runs go one at a time from here on (then ``noisy`` holds them): the chain cannot stack
        them, or the clean step taped a product each run follows (``Tape``: a large one)."""
        chain, R = self.chain, self.runs
        if self.stacked is None:
            return None
        if any(getattr(tape, kind) for kind in tape.KINDS):
            self._unstack()
            return None
        stacked = chain.evaluate_runs(name, self.stacked, R, quiet)
        if stacked is None:
            self._unstack()
            return None
        v = np.asarray(stacked, np.float64).reshape(R, *value.shape)
        noise = np.empty(v.shape)
        for r in range(R):
            self.rngs[r].standard_normal(out=noise[r])
        noise *= bound
        v = np.add(v, noise, out=noise)  # v + noise x bound, as run by run
        self.stacked[name] = v.reshape(R * value.shape[0], *value.shape[1:])
        for k in let_past:
            self.stacked.pop(k, None)
        return float(np.abs(v - value).max(initial=0.0))

    def _unstack(self) -> None:
        """Each run's stages so far, from the stacked batch, for the runs to go on one at a time."""
        for k, v in self.stacked.items():
            for r, part in enumerate(v.reshape(self.runs, -1, *v.shape[1:])):
                self.noisy[r][k] = part
        self.stacked = None

    def _settle_oldest(self) -> None:
        name = next(iter(self.pending))
        self.spread[name] = max(f.result() for f in self.pending.pop(name))
