"""Hypothesis profiles of the suite (registered by the root conftest.py and by the plugin).

ci        the default (README's `pytest -n auto`, which .ci/run runs unchanged): derandomised,
          fixed example counts, no deadline, no example database: the same cases on every run
dev       random cases, failures remembered in the local example database
thorough  many more examples, for a nightly job
zoo       the bug zoo's sampled run: derandomised, few examples, no shrinking (a mutant's
          first failing example is the finding; a minimal one is not needed)
"""

import os

from hypothesis import HealthCheck, Phase, settings

_COMMON = dict(
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def register() -> None:
    settings.register_profile("ci", max_examples=5, derandomize=True, database=None, **_COMMON)
    settings.register_profile("dev", max_examples=20, **_COMMON)
    settings.register_profile("thorough", max_examples=300, **_COMMON)
    settings.register_profile(
        "zoo",
        max_examples=3,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        report_multiple_bugs=False,
        **_COMMON,
    )


def heavy() -> bool:
    """Whether the active profile runs the heavy cases (the thorough profile): the suite's
    budget keeps the ci profile within 120 s on 2 cores, so the widest matrices are nightly."""
    return settings.default.max_examples >= 100


def load_default() -> None:
    """HYPOTHESIS_PROFILE chooses (default ci); hypothesis's own --hypothesis-profile overrides it later."""
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
