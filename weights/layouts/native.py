"""Each framework's native names and layouts (MLX, Flax), safetensors with the config stored:
weights.native's conversions."""

from __future__ import annotations

from weights import files
from weights.canonical import WeightError
from weights.layouts._io import metadata, stored_config
from weights.native import from_native, to_native

FRAMEWORK = {"mlx": "mlx", "flax": "jax"}


def detect_never(path, header) -> bool:
    return False  # an MLX file is told apart only by the layout this project writes in its metadata


def detect_flax(path, header) -> bool:
    return header is not None and any(k.endswith((".kernel", ".scale")) for k in header[1])


def reader(layout: str):
    def read(path, config=None, cast=False, **options):
        state = from_native(files.stored_float32(files.read_timm(path), cast, path), FRAMEWORK[layout])
        config = config or stored_config(path)
        if config is None:
            raise WeightError(f"{path!r}: a native {layout} file without a stored config; pass --config")
        return config, files.check(state, config, what=str(path))

    return read


def writer(layout: str):
    def write(state, config, path, **options) -> None:
        from safetensors.numpy import save_file

        save_file(to_native(state, FRAMEWORK[layout]), path, metadata=metadata(config, layout))

    return write
