"""Shared plumbing of the tests: cached factories, framework converters, mutants and companions."""

from __future__ import annotations

import functools
from functools import lru_cache
from pathlib import Path

from hypothesis import Phase, example, given, settings

from conformance.builtin import framework
from conformance.support import build
from conformance.zoo import MUTANTS
from impls import PORTS, load_factory
from impls.protocol import Unsupported
from weights import mha_shapes


@lru_cache(maxsize=None)
def factory(port: str):
    """A port's factory: a built-in one's, or a given port's whose calls run in its own process."""
    from conformance.plugin import given

    return load_factory(port) if port in PORTS else given(port)


def budget(divisor: int = 1, minimum: int = 3) -> int:
    """A share of the active profile's max_examples, for tests that run whole models."""
    return max(minimum, settings.default.max_examples // divisor)


# The built-in JAX port compiles every new config and batch shape with XLA (0.6 to 1.4 s each on
# the 2-core VM, docs/properties.md), where torch and MLX run a drawn case in milliseconds: in
# the ci profile it draws 1/JAX_SHARE of each property's cases (at least one: with the ci
# profile's 5, one drawn config beside every explicit example). The thorough profile draws the
# same count for every port; users' ports are never scaled.
JAX_SHARE = 5


def _builtin_jax(port) -> bool:
    """Whether a port parameter names the built-in JAX port ('jax' or 'jax+fused'), not a user's."""
    return str(port).partition("+")[0] == "jax"


def jax_runs_the_first(port: str, first: bool, of: str) -> None:
    """The built-in JAX port's share of a parametrized matrix in the ci profile, as ``drawn``'s of
    drawn cases: the first entry (each other one is a program more for XLA to compile); torch,
    MLX and users' ports run them all, and the thorough profile runs every entry on every port.
    Skips the test where ``first`` is false; ``of`` names the matrix's first entry."""
    import pytest

    from conformance import profiles

    if not first and _builtin_jax(port) and not profiles.heavy():
        pytest.skip(f"ci budget: the built-in JAX port runs {of} (thorough: every entry)")


def drawn(max_examples: int | None, examples=(), shrink: bool = True, **strategies):
    """``@settings(max_examples=...)``, ``@example(**e)`` for each of ``examples`` and
    ``@given(**strategies)`` in one decorator (``None``: the profile's count), built twice with
    Hypothesis's public decorators: once for every port, once with the built-in JAX port's share
    of the drawn cases. Each call runs the one its port parameter asks for. ``shrink=False``: a
    failing example is reported as drawn (a whole verify run each: its report is the finding)."""

    from conformance import profiles
    from conformance.plugin import PORT_PARAMS

    count = settings.default.max_examples if max_examples is None else max_examples

    def decorate(body):
        def build(n: int):
            test = given(**strategies)(body)
            for kwargs in reversed(list(examples)):  # run in the order listed
                test = example(**kwargs)(test)
            if shrink:  # the profile's phases (the zoo's shrinks nothing)
                return settings(max_examples=n)(test)
            phases = tuple(p for p in settings.default.phases if p not in (Phase.shrink, Phase.explain))
            return settings(max_examples=n, phases=phases)(test)

        every, shared = build(count), build(max(1, count // JAX_SHARE))

        @functools.wraps(every)
        def test(*args, **kwargs):
            builtin_jax = any(_builtin_jax(kwargs.get(name, "")) for name in PORT_PARAMS)
            return (shared if builtin_jax and not profiles.heavy() else every)(*args, **kwargs)

        return test

    return decorate


def run(port: str, config, state, images, **options):
    """Build and run a port; a config it does not support raises Unsupported (a skip naming it)."""

    return build(factory(port), config, state, **options)(images)


def attention(port: str, case, weights, fused: bool = False):
    """A MultiHeadAttention forward for an AttentionShape with drawn canonical weights."""

    options = case.options
    shapes = mha_shapes(**options)
    if fused:
        options["fused_attn"] = True  # built-in ports only: not part of the attention protocol
    return attention_factory(port)(weights.make_params(shapes), **options)


def attention_on_path(path: str, case, weights):
    """``attention`` for a plugin attention path: 'torch', 'torch+fused' or a given 'pkg.mod:make'."""
    port, _, fused = path.partition("+")
    return attention(port, case, weights, fused=fused == "fused")


def attention_model(case, weights, x, context=None, mask=None):
    """The error model of ``attention(port, case, weights)`` on these inputs."""
    from conformance.numerics.error_model import AttentionModel

    options = case.options
    shapes = mha_shapes(**options)
    return AttentionModel(options, weights.make_params(shapes), x, context, mask)


def mutant(name: str):
    """A zoo mutant's factory, loaded through the same door as a user's port."""

    return load_factory(MUTANTS[name].factory)


def attention_factory(port: str):
    """A built-in port's make_attention, or a user's attention factory given as 'pkg.module:make'
    (run in its own process when given to the plugin)."""
    from conformance.plugin import given

    return framework(port)[0].make_attention if port in PORTS else given(port, "attention")


def grad_factory(port: str):
    """A built-in framework's gradient factory, or a given one (run in its own process)."""
    from conformance.plugin import given
    from conformance.verify.grad import load_grad_factory

    return load_grad_factory(port) if port in PORTS else given(port, "grad")


def check_property(prop, port: str, *args):
    """Run a property; one that needs taps a user's port does not emit is skipped for that port
    (a built-in port emits every tap, so for it that is a failure)."""
    import pytest

    from conformance.properties import NotApplicable

    try:
        return prop(port, *args)
    except NotApplicable as e:
        if port in PORTS:
            raise AssertionError(f"built-in port {port} should support {prop.__name__}: {e}") from None
        pytest.skip(f"{prop.__name__} does not apply to {port}: {e}")


def expect_failure(check, *args, match: str | None = None):
    """Companion checks: the property must fail on a deliberately broken input."""
    import re

    import pytest

    from conformance.properties import PropertyFailure

    try:
        with pytest.raises(PropertyFailure) as info:
            check(*args)
    except Unsupported as e:  # the plugin would report it as a skip: a companion that never ran
        raise AssertionError(f"the broken port does not take the companion's case: {e}") from e
    if match is not None:
        assert re.search(match, str(info.value)), str(info.value)
    return info.value


# The user models and ports the project's own tests verify (tests/), kept beside the suite so docs link them.
DATA_DIR = Path(__file__).with_name("data")
