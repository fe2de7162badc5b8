"""The conformance suite: verify a port (a model and its weight mapping, or a port factory)
against the float64 oracle, stage by stage.

    from conformance import ModelPort
    from conformance.verify import verify, format_report
    print(format_report(verify(ModelPort(MyViT, rename=RENAME), get_config("vit_tiny_patch16_224"))))
"""


def __getattr__(name):
    # Lazily, so `import conformance` (the pytest plugin's package) imports no framework.
    if name == "ModelPort":
        from conformance.capture import ModelPort

        return ModelPort
    if name == "Unsupported":
        from conformance.support import Unsupported

        return Unsupported
    raise AttributeError(f"module 'conformance' has no attribute {name!r}")


__all__ = ["ModelPort", "Unsupported"]
