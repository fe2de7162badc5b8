"""What a port is handed and what its misbehaviour is told as: the sandbox's contract with the
checks above it (conformance.verify). A ``Case`` is the inputs (images, an attention port's ``x``
with its context and mask, or a packed batch's patches and their places) and the canonical state;
``Handed`` gives a port read-only copies and tells a failed step as a ``finding`` in any report
that keeps a ``failures`` list. Nothing here imports a check, the error model or hypothesis: the
port's own process imports this."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from conformance.report import CannotJudge, ToolError, describe_exception
from conformance.support import Unsupported


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


def finding(report, case: str, stage: str, reason: str) -> None:
    finding = {"case": case, "stage": stage, "reason": reason}
    if finding not in report.failures:  # a second pass repeats what the first found
        report.failures.append(finding)


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

    def state_kept(self, report, stage: str) -> bool:
        """Whether the port left the state it was handed as it was; if not, a finding at ``stage``."""
        changed = self.changed_state()
        if changed:
            shown = ", ".join(changed[:4])
            finding(report, self.case.name, stage, f"the port changed the state it was handed: {shown}")
        return not changed

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
