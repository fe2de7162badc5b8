"""timm's model as a ModelPort, in a process where capture itself is broken (what a bug in the
tool looks like from the port's process): verify must say it is the tool's failure, exit 3."""

from conformance import capture
from conformance.examples.timm_vit import port  # noqa: F401 - the port verify is given


def _broken(self, *args, **kwargs):
    raise IndexError("injected")


capture.CapturedForward._read = _broken
