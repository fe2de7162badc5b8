import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from conformance.cli import main  # noqa: E402

sys.exit(main())
