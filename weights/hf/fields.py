"""A config.json's settings read by type: what every Hugging Face importer (vit.py, family.py,
dinov3.py, beit.py, siglip2.py) reads its settings through.

A missing required field, a value of the wrong type ("32", null, true for a width), or one outside
its range (a width of 0, -16 patches, 1e300) is a WeightError naming the field where config.json
holds it (``vision_config.hidden_size`` in a whole CLIP checkpoint), the value found and what was
expected: the user's input, never a traceback. JSON's ``true`` is not an int here, and an int is
not a bool. ViTConfig checks what the settings mean together (a width the heads divide); this
checks each field alone, before anything is computed from it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from weights.canonical import WeightError
from weights.config import MAX_DEPTH

_REQUIRED = object()
MAX_INT = 2**31 - 1  # no size of a ViT is wider than an int32: larger is a corrupt field, not a model


class Fields:
    """The settings of one config.json object (``where``: its path inside the file, "" at the top)."""

    def __init__(self, data: Any, where: str = ""):
        if not isinstance(data, Mapping):
            raise WeightError(f"config.json's {where or 'top level'} is {_shown(data)}: expected a JSON object")
        self.data, self.where = data, where

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _get(self, key: str, default: Any, expected: str) -> Any:
        if key in self.data:
            return self.data[key]
        if default is _REQUIRED:
            raise WeightError(f"config.json has no {self.name(key)}: expected {expected}")
        return default

    def _wrong(self, key: str, value: Any, expected: str) -> WeightError:
        return WeightError(f"config.json's {self.name(key)} is {_shown(value)}: expected {expected}")

    def integer(
        self, key: str, default: Any = _REQUIRED, minimum: int = 1, expected: str = "", maximum: int = MAX_INT
    ) -> int:
        expected = expected or (f"an int >= {minimum}" if minimum != 1 else "a positive int")
        value = self._get(key, default, expected)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._wrong(key, value, expected)
        if value > maximum:
            raise self._wrong(key, value, f"{expected} of at most {maximum}")
        return value

    def depth(self, key: str = "num_hidden_layers") -> int:
        """The number of blocks, refused past ViTConfig's limit before any table of them is built."""
        return self.integer(key, maximum=MAX_DEPTH)

    def number(self, key: str, default: Any = _REQUIRED, positive: bool = True) -> int | float:
        """A finite number as config.json holds it (an int stays an int)."""
        expected = "a positive finite number" if positive else "a finite number"
        value = self._get(key, default, expected)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (positive and value <= 0):
            raise self._wrong(key, value, expected)
        return value

    def flag(self, key: str, default: Any = _REQUIRED) -> bool:
        value = self._get(key, default, "true or false")
        if not isinstance(value, bool):
            raise self._wrong(key, value, "true or false")
        return value

    def text(self, key: str, default: Any = _REQUIRED) -> str:
        value = self._get(key, default, "a string")
        if not isinstance(value, str):
            raise self._wrong(key, value, "a string")
        return value

    def size(self, key: str, default: Any = _REQUIRED) -> int | tuple[int, int]:
        """An image or patch size: a positive int, or a list of two (height, width)."""
        expected = "a positive int or a list of two"
        value = self._get(key, default, expected)
        if isinstance(value, list) and len(value) == 2:
            pair = Fields({"0": value[0], "1": value[1]}, self.name(key))
            return (pair.integer("0"), pair.integer("1"))
        if isinstance(value, list):
            raise self._wrong(key, value, expected)
        return self.integer(key, default, expected=expected)

    def strings(self, key: str) -> list[str]:
        """A list of names (``architectures``): empty where the field is missing or null."""
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._wrong(key, value, "a list of strings")
        return value

    def num_labels(self, default: int) -> int:
        """The classifier's width: ``id2label``'s entries where it is given, else ``num_labels``."""
        if self.data.get("id2label") is not None:
            labels = self.data["id2label"]
            if not isinstance(labels, Mapping):
                raise self._wrong("id2label", labels, "an object of label names")
            return len(labels)
        return self.integer("num_labels", default, minimum=0)

    def mlp_ratio(self, hidden_key: str, D: int, default_hidden: int) -> float:
        """``intermediate_size / hidden_size``, refused where no ratio gives that width back (timm's
        ``int(D * mlp_ratio)``)."""
        hidden = self.integer(hidden_key, default_hidden)
        if int(D * (hidden / D)) != hidden:
            raise WeightError(
                f"config.json's {self.name(hidden_key)} {hidden} is int(hidden_size * r) for no ratio r of "
                f"hidden_size {D}"
            )
        return hidden / D


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) or len(repr(value)) <= 60 else f"{repr(value)[:57]}..."
    return f"{text} ({'null' if value is None else type(value).__name__})"
