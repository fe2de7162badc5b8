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
