"""Hypothesis strategies for the conformance suite, apart from the tests.

Sizes are kept small where size adds nothing (a 2-head, 3x2-patch model exposes a head or
H/W mix-up as well as ViT-B does); what is drawn wide is what hides bugs: non-square grids
and patches, channel counts, poolings, bias on/off, image scales, near-constant images,
weight scales, masks and context shapes. Large arrays come from a NumPy generator whose
seed hypothesis draws, which is fast and replays exactly.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from conformance.generators import (  # noqa: F401 - the deterministic generators, re-exported for the tests
    IMAGE_KINDS,
    OFFSET,
    OFFSET_SCALES,
    SCALES,
    AttentionShape,
    ImageCase,
    TrainedLike,
    WeightCase,
    add_patch_offset,
    make_images,
    with_block0_logit,
)
from conformance.profiles import heavy
from conformance.support import build_config, multiple_of
from impls import ConfigError, get_config
from impls.protocol import ViTConfig
from weights import mha_shapes
from weights.config import GLOBAL_POOLS
from weights.options import OPTIONS

_SUPPORTS = None  # what the port under test supports (conformance.support), set per test by the plugin


def set_supports(supports) -> None:
    global _SUPPORTS
    _SUPPORTS = supports


@st.composite
def family_options(draw) -> dict:
    """The ViT family's options, each drawn on its own from the values its declaration draws
    (``weights.options.OPTIONS``' ``draws``): a config that mixes DINOv2's registers with CLIP's
    norm_pre and SigLIP's head is checked as well as each alone."""
    return {o.field: draw(st.sampled_from(o.draws)) for o in OPTIONS if o.draws}


def _consistent(values: dict) -> dict:
    """Drawn options moved to a valid config: the sin-cos table needs two frequencies of each of x
    and y, the 1-D sinusoid pairs of channels; the distillation head reads the class and
    distillation tokens alone; a rotary embedding turns pairs of head_dim over each of two axes;
    k's bias is dropped only beside q's and v's; BEiT's relative position table has rows for one
    class token, at the config's grid."""
    if values.get("pos_embed") == "sincos" and (values["embed_dim"] % 4 or values["embed_dim"] < 8):
        values["pos_embed"] = "learn"
    if values.get("pos_embed") == "sinusoid" and values["embed_dim"] % 2:  # sin and cos in pairs
        values["pos_embed"] = "learn"
    if values.get("distilled") and (values["global_pool"] != "token" or values.get("reg_tokens")):
        values["distilled"] = False
    if values.get("distilled") and values.get("fc_norm") is True:  # timm's distilled head reads no fc_norm
        values["fc_norm"] = None
    if values.get("rope_type") and (values["embed_dim"] // values["num_heads"]) % 4:  # pairs over two axes
        values["rope_type"] = None
    if values.get("rope_type") != "cat":  # EVA02's rescale is the 'cat' grid's
        values["ref_feat_shape"] = None
    if values.get("rope_type") == "mixed":  # learned frequencies at integer coordinates, neighbouring pairs
        values.update(rope_grid_offset=0.0, rope_rotate_half=False)
    if not values.get("qkv_bias", True):  # no bias to keep apart from k's
        values["k_bias"] = True
    if values.get("rel_pos_bias"):  # BEiT's table: the class token's three rows, at the config's grid
        values.update(class_token=True, reg_tokens=0, distilled=False, dynamic_img_size=False)
    if values.get("attn_pool_num_heads") and values["embed_dim"] % values["attn_pool_num_heads"]:
        values["attn_pool_num_heads"] = None
    if not values.get("window_size"):  # windows cut at the edge or padded: windows to cut or pad
        values["window_partition"] = "pad"
    if values.get("window_partition") == "truncate":  # Qwen2.5-VL's: rotary embeddings beside them
        values["use_rel_pos"] = False
    if values.get("window_size") or values.get("use_rel_pos"):  # SAM's: the patch grid alone, no prefix
        values.update(class_token=False, reg_tokens=0, distilled=False, rel_pos_bias=False)
        if values.get("window_partition") != "truncate":
            values["rope_type"] = None
        values["global_pool"] = "avg" if values.get("global_pool") == "token" else values.get("global_pool", "avg")
    if values.get("use_rel_pos"):  # a global block's tables span the config's grid
        values["dynamic_img_size"] = False
    if not values.get("window_size") or any(i >= values["depth"] for i in values.get("global_attn_indexes", ())):
        values["global_attn_indexes"] = ()
    return values


WIDTHS = (8, 16, 32, 64, 96, 128, 192, 256)  # the widths drawn for a port whose supports rule embed_dim


def declared_widths() -> tuple[int, ...]:
    """For a port whose supports rule ``embed_dim=multiple_of(n)`` (a quantizer's groups of n): the
    two narrowest of ``WIDTHS`` of two groups or more (one group has no neighbour to take a scale
    from), 2n and 4n where WIDTHS has them; () for every other port (its widths drawn as ever)."""

    rule = _SUPPORTS.get("embed_dim") if isinstance(_SUPPORTS, dict) else None
    if not isinstance(rule, multiple_of):
        return ()
    return tuple(d for d in WIDTHS if d % rule.n == 0 and d >= 2 * rule.n)[:2]


@st.composite
def configs(
    draw,
    max_depth: int = 3,
    max_heads: int = 4,
    head_dims=(2, 4, 8),
    max_patch: int = 8,
    max_grid: int = 4,
    pools=None,
    family: bool | str = True,
    min_grid: int = 1,
) -> ViTConfig:
    """Small ViT configs with non-square grids and patches, 1 to 4 channels, every pooling;
    a third of them with the ViT family's options drawn (``family``; ``"half"``: half of them,
    the calibration's share), the rest the original ViT; moved inside what the port under test
    supports (a port written for one config gets it). ``min_grid``: the fewest patches a side."""
    beyond = draw(st.booleans()) if family == "half" else bool(family) and draw(st.integers(0, 2)) == 0
    if pools is None:
        pools = GLOBAL_POOLS if beyond else ("token", "avg")
    num_heads = draw(st.integers(1, max_heads))
    head_dim = draw(st.sampled_from(head_dims))
    widths = declared_widths()
    if widths:  # a port that declares its widths (ones its quantizer's group divides): drawn among them
        embed = draw(st.sampled_from(widths))
        num_heads = draw(st.sampled_from([h for h in range(1, max_heads + 1) if embed % h == 0]))
        head_dim = embed // num_heads
    ph = draw(st.integers(1, max_patch))
    pw = draw(st.one_of(st.just(ph), st.integers(1, max_patch)))
    gh = draw(st.integers(min_grid, max_grid))
    gw = draw(st.integers(min_grid, max_grid))
    pool = draw(st.sampled_from(pools))
    class_token = True if pool == "token" else draw(st.booleans())
    values = dict(
        img_size=(gh * ph, gw * pw),
        patch_size=(ph, pw),
        in_chans=draw(st.integers(1, 4)),
        num_classes=draw(st.integers(1, 6)),
        global_pool=pool,
        class_token=class_token,
        embed_dim=num_heads * head_dim,
        depth=draw(st.integers(1, max_depth)),
        num_heads=num_heads,
        mlp_ratio=draw(st.sampled_from([1.0, 2.0, 4.0])),
        qkv_bias=draw(st.booleans()),
    )
    if beyond:
        values = _consistent({**values, **draw(family_options())})
        if family != "half":  # the suite's draws: one block shows each option (they act per block alike)
            values["depth"] = 1  # and JAX compiles it in a fraction of the time; the calibration keeps 1 to 3
    if _SUPPORTS is None:
        return ViTConfig(**values)
    from hypothesis import assume

    config = build_config(_SUPPORTS, values)
    assume(config is not None)
    return config


def grad_configs(max_depth: int = 2, family: bool | str = True) -> st.SearchStrategy[ViTConfig]:
    """Configs for the gradient checks: every LayerNorm over more than 2 channels. Over 2 its
    output is +-1 whatever the input, so the gradient through it is zero in exact arithmetic
    but for eps / var, and a float32 port returns rounding there (docs/gradients.md)."""
    return configs(max_depth=max_depth, family=family).filter(
        lambda c: (
            c.embed_dim > 2
            and (not c.qk_norm or c.embed_dim // c.num_heads > 2)
            and (not c.patch_norm or c.patch_dim > 2)
        )
    )


def family_configs(max_depth: int = 2, **fixed) -> st.SearchStrategy[ViTConfig]:
    """Drawn configs with the family's options drawn and ``fixed`` set (init_values=1e-5,
    qk_norm=True, global_pool="map", ...): the configs a family property applies to."""
    from hypothesis import assume

    @st.composite
    def draw_config(draw):
        base = draw(configs(max_depth=max_depth, family=False))
        values = {
            **{k: getattr(base, k) for k in base.__dataclass_fields__ if k != "name"},
            **draw(family_options()),
            **fixed,
        }
        if values["global_pool"] == "token" and not values["class_token"]:
            values["class_token"] = True
        values = _consistent(values)
        assume(all(values[k] == v for k, v in fixed.items()))  # the consistency moved a fixed option
        try:
            return ViTConfig(**values)
        except ConfigError:
            assume(False)

    return draw_config()


def image_cases(kinds=IMAGE_KINDS, max_batch: int = 3) -> st.SearchStrategy[ImageCase]:
    """Images of every kind; for a dynamic_img_size model, on a drawn patch grid (smaller or
    larger than the position embedding's: it is resampled both ways)."""
    return st.builds(
        ImageCase,
        kind=st.sampled_from(kinds),
        seed=st.integers(0, 2**31 - 1),
        batch=st.integers(1, max_batch),
        grid=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    )


@st.composite
def weight_cases(draw, scales=SCALES, offsets: bool = True) -> WeightCase:
    scale = draw(st.sampled_from(scales))
    offset = OFFSET if offsets and scale in OFFSET_SCALES and draw(st.integers(0, 2)) == 0 else 0.0
    return WeightCase(draw(st.integers(0, 2**31 - 1)), scale, offset)


@st.composite
def trained_like_weights(draw) -> TrainedLike:
    return TrainedLike(
        draw(st.integers(0, 2**31 - 1)),
        massive=draw(st.sampled_from([30.0, 300.0, 1000.0])),
        logit=draw(st.sampled_from([100.0, 1000.0, 3000.0])),
        offset=draw(st.sampled_from([0.0, 30.0])),
    )


def model_weights() -> st.SearchStrategy:
    """Seeded weights at every scale and offset, and trained-like ones."""
    return st.one_of(weight_cases(), trained_like_weights())


def attention_shape_of(case) -> AttentionShape:
    """The shapes of a drawn attention case (``attention_property_cases``), seed 0: what its
    masks are drawn for."""
    x, o = case.x, case.options
    kv = (case.context if case.context is not None else x).shape[1]
    return AttentionShape(
        x.shape[0], o["num_heads"], o["head_dim"], o["dim"], x.shape[1], kv, o["context_dim"], o["qkv_bias"], 0
    )


@st.composite
def attention_shapes(draw, cross: bool | None = None, min_len: int = 1, max_len: int = 7) -> AttentionShape:
    """Shapes for MultiHeadAttention; cross=True forces another context length and width."""
    num_heads = draw(st.integers(1, 4))
    head_dim = draw(st.sampled_from([2, 4, 8]))
    dim = draw(st.sampled_from([4, 8, 12]))
    q_len = draw(st.integers(min_len, max_len))
    cross = draw(st.booleans()) if cross is None else cross
    if cross:
        kv_len = draw(st.integers(min_len, max_len).filter(lambda n: n != q_len))
        context_dim = draw(st.sampled_from([3, 6, 10]))
    else:
        kv_len, context_dim = q_len, dim
    return AttentionShape(
        batch=draw(st.integers(1, 3)),
        num_heads=num_heads,
        head_dim=head_dim,
        dim=dim,
        q_len=q_len,
        kv_len=kv_len,
        context_dim=context_dim,
        qkv_bias=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@st.composite
def masks(draw, case: AttentionShape, kind: str | None = None, allow_dead_rows: bool = True) -> np.ndarray:
    """A boolean keep-mask or an additive float mask broadcastable to (B, H, Nq, Nk)."""
    kind = draw(st.sampled_from(["bool", "additive"])) if kind is None else kind
    b = draw(st.sampled_from([1, case.batch]))
    h = draw(st.sampled_from([1, case.num_heads]))
    shape = (b, h, case.q_len, case.kv_len)
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    keep = rng.random(shape) < draw(st.sampled_from([0.3, 0.6, 0.9]))
    if not allow_dead_rows:
        keep[..., 0] = True
    if kind == "bool":
        return keep
    bias = rng.normal(0.0, 2.0, shape)
    return np.where(keep, bias, -np.inf).astype(np.float32)


@st.composite
def model_cases(draw, config_strategy=None, images=None, weights=None, min_batch: int = 1, max_batch: int = 2):
    """A whole-model case: config, seeded weights and images, as a properties.ModelCase."""
    from conformance.properties import ModelCase

    config = draw(configs() if config_strategy is None else config_strategy)
    w = draw(model_weights() if weights is None else weights)
    img = draw(image_cases() if images is None else images)
    img = ImageCase(img.kind, img.seed, draw(st.integers(min_batch, max_batch)), img.grid)
    return ModelCase(
        config, w.make(config), img.make(config), info={"weights": w, "images": img}, dtype=current_dtype()
    )


@st.composite
def attention_property_cases(
    draw, cross: bool | None = None, weights=None, square_heads: bool = False, min_len: int = 1
):
    """A standalone attention case as a properties.AttentionCase (context None for self-attention)."""
    from conformance.properties import AttentionCase

    case = draw(attention_shapes(cross=cross, min_len=min_len))
    if square_heads:
        case = AttentionShape(
            **{
                **vars(case),
                "dim": case.num_heads * case.head_dim,
                "context_dim": case.num_heads * case.head_dim if case.kv_len == case.q_len else case.context_dim,
            }
        )
    w = draw(weight_cases(SCALES[:4], offsets=False) if weights is None else weights)
    options = case.options
    state = w.make_params(mha_shapes(**options))
    x, ctx = case.inputs()
    self_attention = case.kv_len == case.q_len and case.context_dim == case.dim and draw(st.booleans())
    return AttentionCase(options, state, x, None if self_attention else ctx, {"weights": w, "seed": case.seed})


_DTYPE = ["float32"]


def set_dtype(dtype: str) -> None:
    """What the drawn whole-model cases ask ports to compute in (the plugin's --dtype)."""
    _DTYPE[0] = dtype


def current_dtype() -> str:
    return _DTYPE[0]


def hard_model_cases():
    """Fixed cases that every profile runs first (hypothesis @example), one per condition where
    a subtle bug shows: near-constant images (LayerNorm epsilon), weights at 4x (activations of
    order 1 to 3: tanh GELU), a large common offset (E[x^2] - E[x]^2 LayerNorm), trained-like
    weights (massive activations, attention logits in the hundreds: a softmax without its max,
    float16 LayerNorm statistics), block 0's logits at 3e4 (q k^T before the scale overflows
    float16) and, in the thorough profile or a float16 run, the offset over 100 tokens (a float16
    token sum overflows; another config, so another compile of every JAX port)."""
    from conformance.properties import ModelCase

    config, many = get_config("vit_test_token"), get_config("vit_test_avg_100_tokens")
    cases = []
    for cfg, weights, kind in (
        (config, WeightCase(7, 1.0), "near_constant"),
        (config, WeightCase(7, 4.0), "ordinary"),
        (config, WeightCase(7, 4.0, OFFSET), "ordinary"),
        (config, TrainedLike(7), "ordinary"),
    ):
        img = ImageCase(kind, 7, 2)
        cases.append(
            ModelCase(
                cfg, weights.make(cfg), img.make(cfg), info={"weights": weights, "images": img}, dtype=current_dtype()
            )
        )
    img = ImageCase("ordinary", 7, 2)
    state = with_block0_logit(config, TrainedLike(7).make(config), img.make(config), 3e4)
    cases.append(
        ModelCase(
            config,
            state,
            img.make(config),
            dtype=current_dtype(),
            info={"weights": "TrainedLike(seed=7), block 0 logits at 3e4", "images": img},
        )
    )
    if heavy() or current_dtype() == "float16":  # where float16 is checked: another config, another JAX compile
        weights, img = WeightCase(7, 4.0, OFFSET), ImageCase("ordinary", 7, 2)
        cases.append(
            ModelCase(
                many,
                weights.make(many),
                img.make(many),
                info={"weights": weights, "images": img},
                dtype=current_dtype(),
            )
        )
    return cases
