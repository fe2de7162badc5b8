"""The property of a port the image properties cannot feed or bound, judged as verify judges it: a port of packed
batches (``inputs="naflex"``: each row against the oracle on its image alone) and a quantized
ModelPort (against the oracle on its own dequantized weights, its cost tabled), on a drawn config.

It takes what verify takes for the port: the factory or ModelPort in this process, or the
``Isolated`` side of a port given to the plugin (its own process), and raises ``PropertyFailure``
with verify's first divergent stage and its reasons, a few lines."""

from __future__ import annotations

from hypothesis import currently_in_test_context, reject

from conformance.properties.core import PropertyFailure
from conformance.support import Unsupported
from conformance.verify.cases import verify_plan
from conformance.verify.forward import verify
from conformance.verify.packed import packed_plan
from impls.protocol import ViTConfig


def check_verified(port: str, side, config: ViTConfig, seed: int, packed: bool, count: int = 2) -> None:
    """verify's verdict on ``config``'s first ``count`` cases (seeded: ordinary images on drawn
    weights first; packed: three grids a batch) is CONFORMANT."""
    plan = (packed_plan if packed else verify_plan)(config, None, seed)
    try:
        report = verify(side, config, port=port, cases=[make() for _, make in plan[:count]], seed=seed)
    except Unsupported:  # a drawn config the port refuses as it builds (timm's NaFlexVit has no word for it)
        if currently_in_test_context():
            reject()
        raise
    if report.conformant:
        return
    failing = [f"{s.name}: {s.reason}" for s in report.stages if not s.ok]
    failing += [f"{f['stage']} ({f['case']}): {f['reason']}" for f in report.failures]
    raise PropertyFailure(
        f"[{port}] verify on {_options(config)} (seed {seed}, {count} case(s)): NOT CONFORMANT, first divergent "
        f"stage {report.located()}\n  " + "\n  ".join(line[:300] for line in failing[:4]),
        stage=report.located(),
    )


def _options(config: ViTConfig) -> str:
    """The config's options that are not ViTConfig's defaults: a drawn config in one line."""
    default = ViTConfig().to_dict()
    return ", ".join(f"{k}={v!r}" for k, v in config.to_dict().items() if v != default[k] and k != "name")
