"""What a port supports: the configs it is written for.

A port factory (or a ``ModelPort``) may carry ``supports``:

* a preset name or a ``ViTConfig``: exactly that config (a port written for one checkpoint);
* a mapping of ``ViTConfig`` fields to a value, a tuple of allowed values or a predicate (such as
  ``multiple_of(64)``: a quantized port's widths, which the property suite then draws), plus
  ``square_images`` / ``square_patches``: ``{"global_pool": "token", "in_chans": 3,
  "qkv_bias": (True,), "square_images": True}``. The ViT family's options (``reg_tokens``,
  ``init_values``, ``global_pool="map"``, ``mlp_layer`` ...) the mapping does not name stay at
  the original ViT's values (``impls.protocol.ORIGINAL_VIT``): a port written for the 2020 ViT
  need not list them, and a port of DINOv2 names what it adds
  (``{"init_values": (1e-5,), "reg_tokens": (0, 4), "no_embed_class": (False, True)}``).

A port that declares nothing is taken to implement the original ViT (every option of it:
poolings, class token, biases, sizes, channels); the family's options reach only the ports
that declare them. ``impls.VIT_FAMILY`` declares all of them (the built-in ports do).

``verify`` refuses a config outside it (naming the option), and the property suite draws only
configs inside it, so a port's red in the plugin speaks of a bug, not of an option it never
claimed. A factory may also raise ``Unsupported`` itself for a config it refuses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from impls.protocol import ANY, ORIGINAL_VIT, VIT_FAMILY, ConfigError, Unsupported, ViTConfig, get_config  # noqa: F401
from conformance.report import UsageError

SHAPE_RULES = ("square_images", "square_patches")


# The fields whose value is a pair: ``(16, 16)`` is that one value, not a choice of 16 or 16
PAIRS = ("img_size", "patch_size", "ref_feat_shape")


def _pair(option: str, rule) -> bool:
    return (
        option in PAIRS
        and isinstance(rule, (tuple, list))
        and len(rule) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in rule)
    )


def _with_family_defaults(supports: Mapping) -> dict:
    """A field-constraint mapping with the family options it does not name pinned to the original
    ViT, a pair-valued option's pair read as its one value."""
    supports = {k: ((tuple(v),) if _pair(k, v) else v) for k, v in supports.items()}
    return {**{k: v for k, v in ORIGINAL_VIT.items() if k not in supports}, **supports}


def supports_of(make) -> Any:
    """What a factory declares; nothing declared is the original ViT."""
    supports = getattr(make, "supports", None)
    return dict(ORIGINAL_VIT) if supports is None else supports


INPUTS = ("images", "naflex")


def inputs_of(make) -> str:
    """What a factory's forward takes, by its ``inputs`` attribute: "images" (B, C, H, W), the
    default, or "naflex": a packed batch as timm's NaFlexVit takes it, a dict of ``patches`` (B, L,
    ph pw C), ``patch_coord`` (B, L, 2) (row, column) and ``patch_valid`` (B, L) (docs/verify.md)."""
    inputs = getattr(make, "inputs", "images")
    if inputs not in INPUTS:
        raise UsageError(f"the port's inputs attribute is {inputs!r}: expected one of {INPUTS}")
    return inputs


class multiple_of:  # noqa: N801 - read as a rule: {"embed_dim": multiple_of(64)}
    """A supports rule: a positive multiple of ``n`` (the widths a quantizer's groups of ``n`` divide)."""

    def __init__(self, n: int):
        self.n = n

    def __call__(self, value) -> bool:
        return isinstance(value, int) and value > 0 and value % self.n == 0

    def __repr__(self) -> str:
        return f"multiple_of({self.n})"


def fixed_config(supports) -> ViTConfig | None:
    if isinstance(supports, str):
        return get_config(supports)
    if isinstance(supports, ViTConfig):
        return supports
    return None


def allowed(rule, value) -> bool:
    """Whether ``value`` meets a supports rule (a value, a tuple of values or a predicate)."""
    if callable(rule):
        return bool(rule(value))
    if isinstance(rule, (tuple, list, set, frozenset)):
        return value in rule
    return value == rule


def _validate(supports: Mapping) -> None:
    names = {f.name for f in fields(ViTConfig)} | set(SHAPE_RULES)
    unknown = sorted(set(supports) - names)
    if unknown:
        raise ValueError(f"supports: unknown option(s) {unknown}; options are ViTConfig's fields and {SHAPE_RULES}")


def unsupported_option(supports, config: ViTConfig) -> str | None:
    """Why ``config`` is outside ``supports`` (naming the option), or None."""
    if supports is None:
        return None
    fixed = fixed_config(supports)
    if fixed is not None:
        diff = [
            f"{f.name}={getattr(config, f.name)!r} (supported: {getattr(fixed, f.name)!r})"
            for f in fields(ViTConfig)
            if f.name != "name" and getattr(config, f.name) != getattr(fixed, f.name)
        ]
        return f"{diff[0]}; the port supports only {fixed.name or 'one config'}" if diff else None
    _validate(supports)
    supports = _with_family_defaults(supports)
    for option, rule in supports.items():
        if option == "square_images" and rule and config.img_size[0] != config.img_size[1]:
            return f"img_size={config.img_size!r} (supported: square images only)"
        if option == "square_patches" and rule and config.patch_size[0] != config.patch_size[1]:
            return f"patch_size={config.patch_size!r} (supported: square patches only)"
        if option in SHAPE_RULES:
            continue
        value = getattr(config, option)
        if not allowed(rule, value):
            what = repr(rule) if not callable(rule) or isinstance(rule, multiple_of) else "a predicate"
            return f"{option}={value!r} (supported: {what})"
    return None


def not_supported(why: str) -> Unsupported:
    """The answer for a config outside what the port declares, with where a port declares it."""
    return Unsupported(
        f"config not supported by the port: {why}; a port declares the configs it takes: "
        "ModelPort(supports={...}), a factory's supports attribute (docs/verify.md)"
    )


def check_supported(supports, config: ViTConfig) -> None:
    why = unsupported_option(supports, config)
    if why:
        raise not_supported(why)


def project(supports, values: dict[str, Any]) -> dict[str, Any] | ViTConfig | None:
    """Drawn config fields moved into ``supports``: fixed values set, a drawn value outside a
    tuple replaced by its first entry, square shapes forced. None when a predicate rejects the
    draw (the caller discards it); the fixed config itself for a single-config port."""
    if supports is None:
        return values
    fixed = fixed_config(supports)
    if fixed is not None:
        return fixed
    _validate(supports)
    supports = _with_family_defaults(supports)
    values = dict(values)
    (ph, pw), (H, W) = values["patch_size"], values["img_size"]
    grid = (H // ph, W // pw)
    if supports.get("square_patches") or supports.get("square_images"):
        pw = ph  # a square image of whole patches: square patches on a square grid
    if supports.get("square_images"):
        grid = (grid[0], grid[0])
    values["patch_size"], values["img_size"] = (ph, pw), (grid[0] * ph, grid[1] * pw)
    for option, rule in supports.items():
        if option in SHAPE_RULES:
            continue
        if callable(rule):
            if not rule(values.get(option)):
                return None
        elif isinstance(rule, (tuple, list, set, frozenset)):
            if values.get(option) not in rule:
                values[option] = sorted(rule, key=repr)[0] if not isinstance(rule, (tuple, list)) else rule[0]
        else:
            values[option] = rule
    if values.get("global_pool") == "token":
        values["class_token"] = True
    return values


def build_config(supports, values: dict[str, Any]) -> ViTConfig | None:
    """The config for drawn ``values`` inside ``supports``, or None when none fits."""
    projected = project(supports, values)
    if projected is None or isinstance(projected, ViTConfig):
        return projected
    try:
        return ViTConfig(**projected)
    except (ConfigError, TypeError, ValueError):
        return None


def describe(supports) -> str:
    if supports is None:
        return "every config"
    fixed = fixed_config(supports)
    if fixed is not None:
        return fixed.name or "one config"
    if supports == VIT_FAMILY:
        return "the whole ViT family"
    return ", ".join(
        f"{k}={'<predicate>' if callable(v) and v is not ANY and not isinstance(v, multiple_of) else v!r}"
        for k, v in supports.items()
    )


def build(make: Callable, config, state, dtype: str = "float32", **options):
    """A port's forward; ``dtype`` is passed only when it is not float32, the protocol's default
    (``options``: a built-in port's keywords, such as ``taps=False``).
    Inside a hypothesis test a config the port does not support (declared, or refused with
    ``Unsupported``) discards the example instead of failing it."""
    try:
        check_supported(supports_of(make), config)
        return make(config, state, **options) if dtype == "float32" else make(config, state, dtype=dtype, **options)
    except Unsupported:
        from hypothesis import reject  # here only: the port's own process never imports hypothesis
        from hypothesis.control import currently_in_test_context

        if currently_in_test_context():
            reject()
        raise
