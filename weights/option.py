"""One option of the ViT family as weights/options.py declares it (``Option``), the layouts'
names the declarations use, and the helpers that say what each layout holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from weights.checks import Check, flag

# the Hugging Face models of the ViT family's layouts (weights/hf/family.py, dinov3.py, beit.py)
DINOV3 = "hf:dinov3_vit"
BEIT = "hf:beit"
SIGLIP2 = "hf:siglip2_vision_model"
HF_FAMILY = ("hf:dinov2", "hf:dinov2_with_registers", "hf:clip_vision_model", "hf:siglip_vision_model", DINOV3, BEIT)
HF_FAMILY += (SIGLIP2,)

# float32's integers are exact to 2^24: beyond, neighbouring grid coordinates round to one value
EXACT_GRID = "beyond, float32 rounds neighbouring grid coordinates to one value: no port can tell the positions apart"


@dataclass(frozen=True)
class Option:
    field: str
    default: Any
    original: Any  # the original ViT's values, in conformance.support's form: a value or a tuple of values
    doc: str
    holds: dict[str, tuple] = field(default_factory=dict)  # layout -> the values it can hold
    hf: str | None = None  # the transformers config's name for it, where one has it
    big_vision: str | None = None
    open_clip: str | None = None
    family: bool = True  # False: an option of the original ViT itself (every layout's question, not a port's)
    timm_name: str | None = ""  # timm's keyword where it is not the field's name; None: timm has none
    # the values the property suite draws for it (a value repeated to draw it more often); () for the
    # sizes and the original ViT's own options, which conformance.strategies.configs draws itself
    draws: tuple = ()
    check: Check = flag()  # what the field's value may be (weights/checks.py), run by ViTConfig
    # each (a canonical key pattern, what a model without those keys lacks, the setting that
    # expresses it): verify's line for a model the config names a part of that it does not have
    lacks: tuple[tuple[str, str, str], ...] = ()
    # (the setting, the config changes that add canonical keys, the option's own first): verify's
    # line for a mapping that reads a key only this option adds
    adds: tuple[str, dict] | None = None

    @property
    def timm(self) -> str | None:
        """timm's ``VisionTransformer`` keyword: the field's own name unless the table says otherwise."""
        return self.field if self.timm_name == "" else self.timm_name


def every(value, *layouts) -> dict[str, tuple]:
    return dict.fromkeys(layouts, value)


def only(value, but: dict[str, tuple | None] | None = None) -> dict[str, tuple]:
    """An option no layout but the canonical one holds other than ``value`` (big_vision's npz,
    open_clip, every Hugging Face family), ``but`` those it names (None: every value)."""
    out = {**every((value,), "npz", "open_clip", *HF_FAMILY), **(but or {})}
    return {layout: values for layout, values in out.items() if values is not None}
