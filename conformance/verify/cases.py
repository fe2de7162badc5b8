"""verify's fixed cases: every image kind on the given or seeded weights, the scales, offset and
trained-like weights where real bugs show, in batches of 3 and 1; handed to a port read-only."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from conformance.generators import IMAGE_KINDS, OFFSET, TrainedLike, WeightCase, make_images, with_block0_logit
from conformance.sandbox.handed import Case, Handed, read_only, state_changes  # noqa: F401 - the plan's inputs, re-exported
from conformance.verify.budget import (
    FULL_SIZE_BATCH,  # noqa: F401 - the plan's, re-exported
    case_batch,
    sizes,
)
from impls import get_config
from impls.protocol import ViTConfig
import re
from concurrent.futures import Future, ThreadPoolExecutor

# The error model and the drawn inputs (hypothesis) are imported where a plan is made: the port's
# process hands cases on and imports neither.
if TYPE_CHECKING:
    from conformance.numerics.error_model import CaseModel


BATCHES = (3, 1)  # 1 catches a port that squeezes the batch; 1 and 3 one that assumes 2


def default_cases(config: ViTConfig, state: dict | None = None, seed: int = 0) -> list[Case]:
    """Every image kind on the given (or seeded) weights, in batches of 3 and 1; with seeded
    weights also weights at 4x timm's spread (activations of order 1 to 3, where tanh and exact
    GELU differ most), a large common offset in every token (where a LayerNorm computing
    E[x^2] - E[x]^2 fails), 64x (saturated softmax) and trained-like weights (massive
    activations, attention logits in the hundreds: where a softmax without its max overflows;
    and logits in the tens of thousands, below float16's 65504 only if q is scaled before q kᵀ)."""
    return list(iter_cases(config, state, seed))


# The seeded cases verify keeps at full size (configs not ``cached``): the fewest that locate every
# model mutant of the zoo, in every dtype, 10x outside its tolerance (or as far as any case does),
# measured by ``python -m conformance zoo --cover`` (docs/data/case_cover.json, docs/zoo.md); a
# dynamic_img_size config keeps its other-grid cases too. In batches of at most FULL_SIZE_BATCH:
# 9 images of the 22 (6 where the batches are cut to one image: ``budget.case_batch``).
FULL_SIZE = (
    "ordinary images (batch 3), trained-like weights, block 0 logits to 3e4",
    "ordinary images (batch 3), weights x4",
    "ordinary images (batch 3), weights x64",
    "ordinary images (batch 1), offset 1000",
    "tiny images (batch 1)",
    "constant images (batch 1)",
)


def images_of(names) -> int:
    """How many images the named cases hold (each name says its batch)."""

    return sum(int(re.search(r"batch (\d+)", name).group(1)) for name in names)


def images_verified(config: ViTConfig, batch: int | None = None) -> int:
    """How many images verify runs on ``config`` (its ``verify_plan``), without making any."""
    return images_of(n for n, _ in verify_plan(config, batch=batch))


def row_plan(row: dict):
    """(config, images, batch) of a benchmark row: the batch its cases were measured in."""

    config = get_config(row["preset"]).replace(**row["settings"])
    batch = row["batch"]
    return config, images_verified(config, batch), batch


def verify_plan(
    config: ViTConfig, state: dict | None = None, seed: int = 0, batch: int | None = None
) -> list[tuple[str, Callable[[], Case]]]:
    """The cases verify runs on ``config``: every default case on a small (``cached``) config,
    the seeded ones of ``FULL_SIZE`` on a full-size one, in batches of at most ``batch`` (by
    default what fits here, ``budget.case_batch``: one image a case where a batch of 3's taps
    would not fit)."""

    full_size = not cached(config)
    if batch is None:
        batch = case_batch(config) if full_size else max(BATCHES)
    return case_plan(config, state, seed, full_size, batch)


def iter_cases(config: ViTConfig, state: dict | None = None, seed: int = 0, full_size: bool = False):
    """``default_cases`` one at a time (``full_size``: the seeded ones of ``FULL_SIZE`` only)."""
    return iter_plan(case_plan(config, state, seed, full_size))


def _make(plan: list[tuple[str, Callable[[], Case]]], i: int) -> Case:
    case = plan[i][1]()
    if not any(later.uses_base for _, later in plan[i + 1 :]):
        plan[i][1].memo.clear()  # no case after this one is on the base weights: not held any longer
    return case


def iter_plan(plan: list[tuple[str, Callable[[], Case]]], ahead: bool = False):
    """A plan's cases one at a time: each weight set is made when its first case is reached and
    not held after its last (a full-size model's five weight sets are not in memory at once).
    ``ahead``: each case after the first is made in a thread while the last is used (two held at
    once; drawing a full-size model's weights is serial work that the comparison's threads leave
    a core for)."""
    return _Ahead(plan) if ahead else _one_by_one(plan)


def _one_by_one(plan):
    for i in range(len(plan)):
        case = _make(plan, i)
        yield case
        del case  # the next case is made without this one held


class _Ahead:
    """The first case made by the caller (nothing to overlap yet, and the modules a case needs are
    imported there before another thread makes one), each next one in the thread."""

    def __init__(self, plan):

        self.plan, self.i = plan, 0
        self.maker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="next-case")
        self.following: Future | None = None
        self.first = bool(plan)

    def __iter__(self):
        return self

    def __next__(self) -> Case:
        if self.first:
            self.first, case = False, _make(self.plan, 0)
        elif self.following is None:
            self.maker.shutdown()
            raise StopIteration
        else:
            case = self.following.result()
        self.i += 1
        self.following = self.maker.submit(_make, self.plan, self.i) if self.i < len(self.plan) else None
        return case


def _unbatched(name: str) -> str:

    return re.sub(r"\(batch \d+\)", "(batch)", name)


def case_plan(
    config: ViTConfig, state: dict | None = None, seed: int = 0, full_size: bool = False, max_batch: int = 3
) -> list[tuple[str, Callable[[], Case]]]:
    """(name, make the case) for each of ``default_cases``, in order; nothing is made until asked.
    ``full_size`` (with seeded weights): ``FULL_SIZE`` and the other-grid cases only.
    ``max_batch``: no case holds more images (its name says the batch it has)."""

    memo: dict[str, dict] = {}

    def base() -> dict:
        if "base" not in memo:
            # a dict of our own: the caller's is not changed (``Isolated`` maps a large state back in it)
            memo["base"] = dict(state) if state is not None else WeightCase(seed, 1.0).make(config)
        return memo["base"]

    def case(name, batch, kind, image_seed, weights=None, grid=None, logit=None):
        if batch > max_batch:
            name, batch = name.replace(f"(batch {batch})", f"(batch {max_batch})"), max_batch

        def make() -> Case:
            images = (
                make_images(config, batch, kind, image_seed, grid)
                if grid
                else make_images(config, batch, kind, image_seed)
            )
            weights_ = base() if weights is None else weights.make(config)
            if logit is not None:
                weights_ = with_block0_logit(config, weights_, images, logit)
            return Case(name, images, weights_)

        make.uses_base, make.memo = weights is None, memo
        return name, make

    plan = []
    for i, kind in enumerate(IMAGE_KINDS):
        batch = BATCHES[i % len(BATCHES)]
        plan.append(case(f"{kind} images (batch {batch})", batch, kind, seed + i))
    if state is None:
        for i, (w, label) in enumerate(
            (
                (WeightCase(seed + 1, 4.0), "weights x4"),
                (WeightCase(seed + 2, 4.0, OFFSET), "offset 1000"),
                (WeightCase(seed + 3, 64.0), "weights x64"),
                (TrainedLike(seed + 4), "trained-like weights"),
            )
        ):
            batch = BATCHES[i % len(BATCHES)]
            plan.append(case(f"ordinary images (batch {batch}), {label}", batch, "ordinary", seed, w))
        plan.append(
            case(
                "ordinary images (batch 3), trained-like weights, block 0 logits to 3e4",
                3,
                "ordinary",
                seed,
                TrainedLike(seed + 4),
                logit=3e4,
            )
        )
    if config.dynamic_img_size:  # the position embedding resampled up and down at run time
        gh, gw = config.grid_size
        for grid in ((gh + 2, gw + 1), (max(1, gh // 2), max(1, gw - 1))):
            plan.append(
                case(
                    f"ordinary images (batch 2) on a {grid[0]}x{grid[1]} patch grid", 2, "ordinary", seed + 5, grid=grid
                )
            )
    if full_size and state is None:
        keep = {_unbatched(n) for n in FULL_SIZE}
        plan = [(name, make) for name, make in plan if _unbatched(name) in keep or "patch grid" in name]
    return plan


def cached(config: ViTConfig) -> bool:
    """Whether verify keeps a config's seeded cases and their error models for the next port:
    small configs only (the zoo verifies 28 ports on vit_test_token's); a full-size model's are
    made one at a time and let go."""

    return sizes(config)[0] < 1e6


# A small config's given cases' error models, by content (``held_models``), the last few kept.
_HELD: OrderedDict[tuple, CaseModel] = OrderedDict()
HELD_MODELS = 8


def _digest(case: Case) -> str:
    """The case's images and weights, names, dtypes, shapes and bytes, as one digest."""
    h = hashlib.blake2b(digest_size=20)
    for name, a in (("", case.images), *sorted(case.state.items())):
        a = np.ascontiguousarray(a)
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.reshape(-1).view(np.uint8).data)  # as bytes: a buffer of bfloat16 is refused
    return h.hexdigest()


def holdable(cases) -> bool:
    """Whether a small config's given cases are held as its seeded cases are: batches no larger
    than theirs (a larger one is streamed, its oracle let go as it is read: held, a case of 64
    images and eight models of them would keep gigabytes)."""
    return all(np.shape(case.images)[0] <= max(BATCHES) for case in cases)


def held_models(config: ViTConfig, cases, dtype: str) -> tuple[tuple[Case, CaseModel], ...]:
    """A small config's given cases, each with its error model held as a seeded case's is: looked
    up by content, so the same weights and images verified again (the next port, the next check)
    reuse its oracle and noisy runs instead of computing them afresh. A model is built on copies
    (read-only): what a caller does to its arrays afterwards cannot reach it."""
    from conformance.numerics.error_model import CaseModel

    out = []
    for case in cases:
        key = (config, dtype, _digest(case))
        model = _HELD.pop(key, None)
        if model is None:
            state = {k: read_only(v) for k, v in case.state.items()}
            model = CaseModel(config, state, read_only(case.images), dtype)
        _HELD[key] = model
        while len(_HELD) > HELD_MODELS:
            _HELD.popitem(last=False)
        out.append((case, model))
    return tuple(out)


@lru_cache(maxsize=8)
def seeded_cases(config: ViTConfig, seed: int, dtype: str) -> tuple[tuple[Case, CaseModel], ...]:
    """The default cases on seeded weights and their error models, built once per config, seed
    and dtype (the zoo verifies 28 ports on the same ones); their arrays are read-only."""
    from conformance.numerics.error_model import CaseModel

    out = []
    for case in default_cases(config, None, seed):
        case = Case(case.name, read_only(case.images), {k: read_only(v) for k, v in case.state.items()})
        out.append((case, CaseModel(config, case.state, case.images, dtype)))
    return tuple(out)
