"""A bug class: a named variant of one operation, what a fit compares a divergent stage with
(``conformance.diagnosis.classes`` holds them all)."""

from __future__ import annotations


from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache


from conformance.numerics.error_model import Precision
from impls.protocol import ConfigError, ViTConfig


@lru_cache(maxsize=1024)
def _expressible(config: ViTConfig, changes: tuple) -> bool:
    try:
        config.replace(**dict(changes))
    except ConfigError:
        return False
    return True


QUIET = Precision("float32", bounds=False)  # values only: a variant's bound is never read


def _always(config: ViTConfig) -> bool:
    return True


@dataclass(frozen=True)
class BugClass:
    name: str
    kinds: tuple[str, ...]
    says: str
    hint: str
    config: Mapping = field(default_factory=dict)
    state: Callable | None = None
    stage: Callable | None = None
    when: Callable[[ViTConfig], bool] = _always
    # A class whose difference is not one array but a family: "token_statistics", a LayerNorm whose
    # per-token variance is off by float32's cancellation in E[x^2] - E[x]^2 (rounding the oracle
    # cannot replay in the port's order of summation: fitted per token, fit.token_statistics);
    # "eps", a LayerNorm with an eps of its own (fitted over a grid of them, fit.fitted_eps);
    # "factor", any stage times a constant (the meaningful ones, then fitted: fit.constant_factor)
    family: str | None = None
    attention: Callable | None = None  # a standalone attention's weights(q, k, mask, options) (ATTENTION_CLASSES)
    gradient: Callable | None = None  # a gradient's value under the class (GRADIENT_CLASSES)
    # A precision bug that shows only out of range (an overflow): where the stage is finite its
    # difference is a rounding pattern, no direction a share along could mean anything
    overflow: bool = False

    def applies(self, config: ViTConfig) -> bool:
        if any(getattr(config, k) == v for k, v in self.config.items()):
            return False  # the config already computes it: not a bug there
        if self.config and not _expressible(config, tuple(self.config.items())):
            return False  # no model computes it with the rest of this config
        return self.when(config)
