"""Hypothesis profiles for the conformance suite, and the process-wide setup of the frameworks.

Profiles (choose with ``--hypothesis-profile NAME`` or ``HYPOTHESIS_PROFILE=NAME``):
  ci        derandomised, fixed example counts, no deadline, no example database: the same
            cases on every run (.ci/run uses it)
  dev       the default: random cases, a few more of them, failures remembered locally
  thorough  many more examples, for a nightly job
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import HealthCheck, settings  # noqa: E402

_common = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow,
                                                                      HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=10, derandomize=True, database=None, **_common)
settings.register_profile("dev", max_examples=20, **_common)
settings.register_profile("thorough", max_examples=300, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
