"""What one config field's value may be, declared beside its option (weights/options.py) and
run by ``ViTConfig`` for every field: a check takes the value and the field's name, returns the
value as the config holds it (a size as a pair) or raises ``ConfigError`` naming the field, what
it must be and what it got. Rules between fields stay the config's (weights/config.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable


class ConfigError(ValueError):
    """A ViTConfig whose options contradict each other."""


# float32's largest finite and smallest normal magnitudes (numpy.finfo(numpy.float32).max, .tiny)
FLOAT32_MAX, FLOAT32_TINY = 3.4028234663852886e38, 1.1754943508222875e-38


def pair(value: Any, name: str) -> tuple[int, int]:
    """An int or a pair of ints, as a pair."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an int or a pair of ints, got {value!r}")
    if isinstance(value, int):
        return (value, value)
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return (int(value[0]), int(value[1]))
    raise ConfigError(f"{name} must be an int or a pair of ints, got {value!r}")


def real(value: Any, name: str, optional: bool = False) -> None:
    """A finite real number (not a bool, a string or Infinity from a JSON config) that float32
    holds: every port computes with the config's numbers in float32 or coarser, so a value it
    rounds to Inf or to 0 (or a subnormal) is a config no port can run, not a finding about one."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number{' or None' if optional else ''}, got {value!r}")
    if abs(value) > FLOAT32_MAX or 0 < abs(value) < FLOAT32_TINY:
        raise ConfigError(
            f"{name} must be a number float32 holds (0, or a magnitude from {FLOAT32_TINY:.3g} to {FLOAT32_MAX:.3g}): "
            f"got {value!r}, which float32 rounds to {'Inf' if abs(value) > 1 else '0 or a subnormal'}"
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Check:
    """A field's type (as ``ViTConfig`` annotates it) and the test of its value."""

    type: str
    run: Callable[[Any, str], Any]
    none: str = ""  # what None means, where the field may be None

    def __call__(self, value: Any, name: str) -> Any:
        if self.none and value is None:
            return None
        return self.run(value, name)


def _or_none(none: str) -> str:
    return f"None ({none}) or " if none else ""


def flag(none: str = "") -> Check:
    """True or False (or None, meaning ``none``)."""

    def run(value, name):
        if not isinstance(value, bool):
            what = f"None ({none}), True or False" if none else "a bool"
            raise ConfigError(f"{name} must be {what}, got {value!r}")
        return value

    return Check("bool | None" if none else "bool", run, none)


def one_of(values: tuple, none: str = "") -> Check:
    """One of a few names (or None, meaning ``none``)."""

    def run(value, name):
        if not isinstance(value, str) or value not in values:
            raise ConfigError(f"{name} must be {_or_none(none)}one of {values}, got {value!r}")
        return value

    return Check("str | None" if none else "str", run, none)


def count(least: int, none: str = "") -> Check:
    """An int of at least ``least`` (or None, meaning ``none``)."""

    def run(value, name):
        if not _is_int(value) or value < least:
            what = "a positive int" if least == 1 else f"an int >= {least}"
            raise ConfigError(f"{name} must be {_or_none(none)}{what}, got {value!r}")
        return value

    return Check("int | None" if none else "int", run, none)


def number(
    low: float | None = None, high: float | None = None, none: str = "", within: float | None = None, why: str = ""
) -> Check:
    """A real number float32 holds, above ``low`` and below ``high`` where given, at most
    ``within`` in magnitude (``why``: what lies beyond) (or None, meaning ``none``)."""

    def run(value, name):
        real(value, name)
        if (low is not None and not value > low) or (high is not None and not value < high):
            bounds = f"in ({low:g}, {high:g})" if low is not None and high is not None else f"> {low:g}"
            raise ConfigError(f"{name} must be {_or_none(none)}{bounds}, got {value!r}")
        if within is not None and abs(value) > within:
            limit = f"2^{math.log2(within):.0f}" if math.log2(within).is_integer() else f"{within:g}"
            raise ConfigError(f"{name} must be at most {limit} in magnitude ({why}), got {value!r}")
        return value

    return Check("float | None" if none else "float", run, none)


def grid(none: str = "") -> Check:
    """A positive int or a pair of them, held as a pair (or None, meaning ``none``)."""

    def run(value, name):
        out = pair(value, name)
        if min(out) < 1:
            raise ConfigError(f"{name} must be positive, got {value!r}")
        return out

    return Check("int | tuple[int, int] | None" if none else "int | tuple[int, int]", run, none)


def indexes() -> Check:
    """Distinct non-negative ints in increasing order (a list or a tuple), held as a tuple."""

    def run(value, name):
        if not isinstance(value, (list, tuple)) or not all(_is_int(v) and v >= 0 for v in value):
            raise ConfigError(f"{name} must be a list of non-negative ints (block indices), got {value!r}")
        if list(value) != sorted(set(value)):
            raise ConfigError(f"{name} must be distinct and increasing, got {value!r}")
        return tuple(value)

    return Check("tuple[int, ...]", run)
