"""Hypothesis profiles for the conformance suite, and process-wide framework setup.

Choose a profile with ``--hypothesis-profile NAME`` or ``HYPOTHESIS_PROFILE=NAME``:
``ci`` (derandomised, fixed example counts, no deadline), ``dev`` (the default) or
``thorough`` (many more examples, for a nightly job); see conformance/profiles.py.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from conformance import profiles  # noqa: E402

profiles.register()
profiles.load_default()


def pytest_collection_modifyitems(config, items):
    # The meta-tests that start their own pytest run take longest: schedule them first, so
    # pytest-xdist can fill the other worker meanwhile instead of waiting on them at the end.
    first = ("test_zoo.py", "test_plugin.py", "test_verify.py")
    items.sort(key=lambda item: 0 if item.path.name in first else 1)
