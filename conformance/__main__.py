import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from conformance.home import shadowing  # noqa: E402 - before anything imports the packages it checks

if shadowing():
    print(f"usage error: {shadowing()}", file=sys.stderr)
    sys.exit(2)

from conformance.commands.cli import main  # noqa: E402

sys.exit(main())
