"""Which of a tower's unfilled parameters lie after its output (``ModelPort(tower=...)``): a VLM's
vision tower, unmodified, keeps the merger, projector or neck its model adds after it, and the
canonical weights have nothing for them. Those parameters are out of scope, as the stages after the
tower are; any other unfilled parameter stays a finding at ``load`` (a part the config does not
name, left at the model's initial values).

A parameter is after the output when changing it changes nothing the port returns: the loaded
model is run on one image, then with the unfilled parameters moved far from their values, and
every stage it returns is compared bitwise. All of them at once first (one run: the usual case, a
merger); where that moves a stage, one module's parameters at a time. A port that does not return
the same arrays twice (dropout left on) keeps every one of them a finding."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from conformance.capture.plan import AFTER_TOWER
from conformance.report import CannotJudge
from conformance.returned import Taps

# (build, config, dtype, unfilled keys) -> those after the tower's output: probed once per model, not per case
_BEYOND: dict[tuple, list[str]] = {}
_MOVE = 4.0  # each entry moved by this many times (its largest magnitude + 1): a change no stage can miss


def _returned(run: Callable[[np.ndarray], Taps], images: np.ndarray) -> dict[str, np.ndarray] | None:
    try:
        taps = run(images)
    except Exception:  # noqa: BLE001 - a model that fails on moved weights: read as a stage they reach
        return None
    return {k: np.array(v, copy=True) for k, v in taps.items()}


def _same(a: dict | None, b: dict | None) -> bool:
    return (
        a is not None
        and b is not None
        and a.keys() == b.keys()
        and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)
    )


def _after_tower(plan) -> list[str]:
    """The stages the plan leaves out of scope as after the tower's output."""
    return [s for s, why in plan.unseen.items() if why.startswith(AFTER_TOWER)]


def after_output(
    run: Callable[[np.ndarray], Taps],
    load: Callable[[Mapping[str, np.ndarray]], None],
    arrays: Mapping[str, np.ndarray],
    unfilled: list[str],
    images: np.ndarray,
) -> list[str]:
    """The keys of ``unfilled`` that nothing ``run`` returns depends on. ``load(arrays)`` loads a
    whole set of the model's arrays (``arrays``: as loaded); the model is left loaded as it was."""
    moving = [k for k in unfilled if np.issubdtype(np.asarray(arrays[k]).dtype, np.floating)]
    base = _returned(run, images)
    if base is None or not moving or not _same(base, _returned(run, images)):
        return []
    # an unfilled parameter's array may be a view of the model's own (torch's .numpy()): held apart
    loaded = {**arrays, **{k: np.array(arrays[k], copy=True) for k in moving}}
    rng = np.random.default_rng(0)

    def unmoved_by(keys: list[str]) -> bool:
        moved = dict(loaded)
        for k in keys:
            v = np.asarray(loaded[k], np.float32)
            moved[k] = v + _MOVE * (float(np.abs(v).max(initial=0.0)) + 1.0) * rng.standard_normal(v.shape, np.float32)
        try:
            load(moved)
            return _same(base, _returned(run, images))
        except Exception:  # noqa: BLE001 - a model that refuses the moved values: read as reached
            return False
        finally:
            load(loaded)

    if unmoved_by(moving):
        return moving
    modules: dict[str, list[str]] = {}
    for k in moving:
        modules.setdefault(k.rpartition(".")[0], []).append(k)
    return [k for keys in modules.values() if unmoved_by(keys) for k in keys]


def after_tower(
    build, forward, load: Callable[[Mapping[str, np.ndarray]], None], arrays, unfilled: list[str]
) -> list[str]:
    """``unfilled`` but the parameters after a tower's output (``after_output``; ``forward``: the
    captured forward of the model ``build`` made, loaded), named in the unseen reason of the stages
    after it. A model is probed once: its structure is its build's, whatever a case's weights."""
    plan, config = forward.plan, forward.config
    after = _after_tower(plan)
    if not after:
        return unfilled
    key = (build, config, forward.dtype, tuple(unfilled))  # the build held: never another's by a reused id
    try:
        beyond = _BEYOND.get(key)
    except TypeError:  # a build that cannot be a key: probed at each build
        key = beyond = None
    if beyond is None:
        images = np.random.default_rng(0).uniform(-1, 1, (1, config.in_chans, *config.img_size))
        beyond = after_output(forward, load, arrays, unfilled, images.astype(np.float32))
        if key is not None:
            _BEYOND[key] = beyond
            while len(_BEYOND) > 64:
                del _BEYOND[next(iter(_BEYOND))]
    if beyond:
        note = (
            f"; the model's {len(beyond)} parameter(s) there, which the tower's stages do not depend on, "
            f"left at its values: {', '.join(beyond[:4])}" + (" ..." if len(beyond) > 4 else "")
        )
        for s in after:
            plan.unseen[s] += note
    return [k for k in unfilled if k not in beyond]


def no_gradient_past_tower(plan, tower: str | None) -> None:
    """A tower's gradient: its model's own loss differentiates what the model returns, after the
    tower's output (a merger, an adapter), which the canonical model has no part for. Exit 2 naming
    it (the reference's gradient is the headless model's), never a finding about the port."""
    after = _after_tower(plan)
    if after:
        raise CannotJudge(
            f"ModelPort(tower={tower!r}): the model's loss differentiates what it returns, after its tower's "
            f"output ({', '.join(after)} out of scope): the tower's gradient alone is not checked yet; its "
            "forward is (verify without --grad)"
        )
