"""mlx-image's ViT as a ModelPort, in a process where capture itself is broken (what a bug in
the tool looks like from the port's process): verify must say it is the tool's failure, exit 3.
(An MLX model: its process starts in a fraction of the time a torch one takes.)"""

from conformance import capture
from conformance.examples.mlx_image_vit import port  # noqa: F401 - the port verify is given


def _broken(self, *args, **kwargs):
    raise IndexError("injected")


capture.CapturedForward._read = _broken
