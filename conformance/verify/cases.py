"""verify's fixed cases: every image kind on the given or seeded weights, the scales, offset and
trained-like weights where real bugs show, in batches of 3 and 1; handed to a port read-only."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from conformance.verify.budget import FULL_SIZE_BATCH  # noqa: F401 - the plan's, re-exported
from impls.protocol import ViTConfig

# The error model and the drawn inputs (hypothesis) are imported where a plan is made: the port's
# process hands cases on and imports neither.
if TYPE_CHECKING:
    from conformance.numerics.error_model import CaseModel


BATCHES = (3, 1)  # 1 catches a port that squeezes the batch; 1 and 3 one that assumes 2


@dataclass
class Case:
    """What a port is handed: the images (an attention port's query input ``x``), the canonical
    state, for an attention port its context and mask, for a packed batch its patches' places."""

    name: str
    images: np.ndarray
    state: dict
    context: np.ndarray | None = None
    mask: np.ndarray | None = None
    # a packed batch (NaFlex, conformance.verify.packed): ``images`` its patches (B, L, ph pw C),
    # each patch's (row, column) and whether it is an image's or padding
    patch_coord: np.ndarray | None = None
    patch_valid: np.ndarray | None = None


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
    import re

    return sum(int(re.search(r"batch (\d+)", name).group(1)) for name in names)


def images_verified(config: ViTConfig, batch: int | None = None) -> int:
    """How many images verify runs on ``config`` (its ``verify_plan``), without making any."""
    return images_of(n for n, _ in verify_plan(config, batch=batch))


def row_plan(row: dict):
    """(config, images, batch) of a benchmark row: the batch its cases were measured in."""
    from impls import get_config

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
    from conformance.verify.budget import case_batch

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
        from concurrent.futures import Future, ThreadPoolExecutor

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
    import re

    return re.sub(r"\(batch \d+\)", "(batch)", name)


def case_plan(
    config: ViTConfig, state: dict | None = None, seed: int = 0, full_size: bool = False, max_batch: int = 3
) -> list[tuple[str, Callable[[], Case]]]:
    """(name, make the case) for each of ``default_cases``, in order; nothing is made until asked.
    ``full_size`` (with seeded weights): ``FULL_SIZE`` and the other-grid cases only.
    ``max_batch``: no case holds more images (its name says the batch it has)."""
    from conformance.strategies import IMAGE_KINDS, OFFSET, TrainedLike, WeightCase, make_images, with_block0_logit

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


def read_only(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


def state_changes(handed: Mapping, original: Mapping) -> list[str]:
    """What a port did to the state dict it was handed: keys removed, added or replaced."""
    changes = [f"removed {k!r}" for k in sorted(original) if k not in handed]
    changes += [f"added {k!r}" for k in sorted(handed) if k not in original]
    changes += [
        f"replaced {k!r}"
        for k in sorted(original)
        if k in handed
        and handed[k] is not original[k]  # the same read-only array: unchanged, without reading it
        and not (
            isinstance(handed[k], np.ndarray)
            and handed[k].shape == original[k].shape
            and np.array_equal(handed[k], original[k])
        )
    ]
    return changes


def cached(config: ViTConfig) -> bool:
    """Whether verify keeps a config's seeded cases and their error models for the next port:
    small configs only (the zoo verifies 28 ports on vit_test_token's); a full-size model's are
    made one at a time and let go."""
    from conformance.verify.budget import sizes

    return sizes(config)[0] < 1e6


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


class Handed:
    """A case as a port is handed it: read-only copies of its state and images, and what a
    misbehaving port does with them told as a finding (the forward, gradient and attention checks
    share it). ``call`` runs a step of the port; ``tampered`` says how it changed its inputs."""

    def __init__(self, case: Case, copy: bool = True):
        """``copy=False``: the case's arrays are handed as they are, already read-only for good
        (the port's process maps them read-only: no copy of a full-size model's weights)."""
        self.case = case
        keep = read_only if copy else (lambda a: a)
        self.state = {k: keep(v) for k, v in case.state.items()}
        self.images = keep(case.images)
        self.context = None if case.context is None else keep(case.context)
        self.packed = None if case.patch_valid is None else (keep(case.patch_coord), keep(case.patch_valid))

    @property
    def inputs(self):
        """What the port's forward is called with: the images, or a packed batch as timm's NaFlexVit
        takes it (a dict of its patches, their coordinates and validity)."""
        if self.packed is None:
            return self.images
        return {"patches": self.images, "patch_coord": self.packed[0], "patch_valid": self.packed[1]}

    # What a port's call may raise and still be a finding: in verify's own process not a
    # KeyboardInterrupt (the user's Ctrl-C); in the port's own process anything (nothing else
    # interrupts it there).
    port_errors: tuple[type[BaseException], ...] = (Exception, SystemExit)
    # Told the step before it runs (the port's process reports where it was if it dies).
    on_step = None

    def call(self, report, stage: str, fn, *args):
        """(True, fn(*args)), or (False, None) with the port's exception a finding at ``stage``;
        an ``Unsupported`` config and the tool's own failures pass through."""
        from conformance.report import CannotJudge, ToolError, describe_exception
        from conformance.support import Unsupported
        from conformance.verify.report import finding

        if Handed.on_step is not None:
            Handed.on_step(stage)
        try:
            return True, fn(*args)
        except (Unsupported, ToolError, CannotJudge):  # the config, and the tool: not the port's doing
            raise
        except Handed.port_errors as e:  # the port's failure is the finding
            if isinstance(e, SystemExit):
                reason = f"the port exited (sys.exit({e.code!r})) before returning"
            elif isinstance(e, ValueError) and "read-only" in str(e):
                reason = "the port wrote to its inputs, which verify hands read-only: " + describe_exception(e)
            else:
                reason = "the port raised " + describe_exception(e)
            finding(report, self.case.name, stage, reason)
            return False, None

    def changed_state(self) -> list[str]:
        return state_changes(self.state, self.case.state)

    def wrote_images(self) -> bool:
        """Whether the port wrote to the images (or an attention port's context)."""
        return (
            not np.array_equal(self.images, self.case.images)
            or (self.context is not None and not np.array_equal(self.context, self.case.context))
            or (
                self.packed is not None
                and not (
                    np.array_equal(self.packed[0], self.case.patch_coord)
                    and np.array_equal(self.packed[1], self.case.patch_valid)
                )
            )
        )
