"""The process a port runs in: ``python -m conformance.sandbox.child REQUESTS ANSWERS``.

It reads one JSON request per line from the file descriptor REQUESTS and writes JSON lines to
ANSWERS: ``{"step": ...}`` before each call into the port (so verify knows where a port that
kills its process was), then the answer. Arrays come and go as files (``.npy``, packs of small ones) in directories
verify created (``conformance.sandbox.wire``). The port's own output (print, logging) goes to
standard output and error, never to ANSWERS. Requests:

    hello      {kind: forward|grad|attention, spec, taps}: import the port; its default config
    unsupported {config}: why the port refuses it, or null
    forward / twice / backward / attention   {config, dtype, case, loss, options, out}: the
               port side of a check (``portside.InProcess``), its output written to ``out``

Answers have ``status``: ``ok``, ``usage`` (the port cannot be loaded: verify's exit 2),
``stopped`` (the port's module exited or was interrupted while imported: a finding),
``unsupported`` (the port refuses the config), ``tool`` (this tool failed here, with the
traceback: verify's exit 3).
"""

from __future__ import annotations

import os
import sys
import traceback

import conformance.sandbox.wire as wire
from conformance.report import CannotJudge, UsageError, describe_exception
from conformance.sandbox.handed import Case, Handed
from conformance.sandbox.heap import return_freed_memory
from conformance.sandbox.isolated import MEMORY_ENV
from conformance.sandbox.portable import OutputLimits
from conformance.sandbox.portside import InProcess, PortStopped, default_config, load_port
from conformance.support import Unsupported
from impls.protocol import Loss, ViTConfig
from conformance.report import resource_problem
from conformance.report import ToolError


def _case(tree, reader):

    return Case(
        tree["name"],
        reader.decode(tree["images"]),
        reader.decode(tree["state"]),
        reader.decode(tree.get("context")),
        reader.decode(tree.get("mask")),
        reader.decode(tree.get("patch_coord")),
        reader.decode(tree.get("patch_valid")),
    )


class Child:
    def __init__(self, answers):
        self.answers = answers
        self.side = None

    def send(self, message) -> None:

        self.answers.write(wire.dumps(message))
        self.answers.flush()

    def hello(self, kind: str, spec: str, taps=()):

        try:
            make = load_port(kind, spec, taps)  # a UsageError is an answer of its own (handle)
        except (SystemExit, KeyboardInterrupt) as e:  # not a port that failed to load: one that stopped
            what = f"sys.exit({e.code!r})" if isinstance(e, SystemExit) else "KeyboardInterrupt"
            return {"status": "stopped", "message": f"the port stopped ({what}) while it was imported"}
        self.side = InProcess(make, spec, copy=False)  # the cases arrive mapped read-only
        default = default_config(make) if kind == "forward" else None
        return {"status": "ok", "default_config": None if default is None else default.to_dict()}

    def handle(self, request: dict):

        op = request.get("op")
        try:
            if op == "hello":
                return self.hello(request["kind"], request["spec"], request.get("taps") or ())
            if op == "unsupported":
                why = self.side.unsupported(ViTConfig.from_dict(request["config"]))
                return {"status": "ok", "why": why, "inputs": self.side.inputs}
            reader = wire.Reader(request["root"], mmap=True)
            case = _case(request["case"], reader)
            writer = wire.Writer(request["root"], request["out"])
            config = ViTConfig.from_dict(request["config"]) if op in ("forward", "twice") else None
            limits = OutputLimits(case, config)  # what the port returns, checked before it is written
            if op == "attention":
                out, findings = self.side.attention(case, dict(request["options"]))
            else:
                config, dtype = ViTConfig.from_dict(request["config"]), request["dtype"]
                if op == "forward":
                    out, findings = self.side.forward(case, config, dtype)
                elif op == "twice":  # the first output written before the second call
                    both, findings = self.side.twice(
                        case, config, dtype, keep=lambda out: writer.encode(limits.portable(out))
                    )
                    tree = None if both is None else {"__tuple__": [both[0], writer.encode(limits.portable(both[1]))]}
                    return {"status": "ok", "out": tree, "findings": [list(f) for f in findings]}
                elif op == "backward":
                    loss = request["loss"]
                    loss = Loss(loss["kind"], reader.decode(loss.get("labels")), reader.decode(loss.get("weights")))
                    out, findings = self.side.backward(case, config, dtype, loss)
                else:
                    return {"status": "tool", "message": f"unknown request {op!r}", "traceback": ""}
            out = limits.portable(out)
            return {"status": "ok", "out": writer.encode(out), "findings": [list(f) for f in findings]}
        except Unsupported as e:
            return {"status": "unsupported", "message": str(e)}
        except UsageError as e:  # cannot_judge: found by the tool inside the port's call (CannotJudge)
            return {"status": "usage", "message": str(e), "label": e.label, "cannot_judge": isinstance(e, CannotJudge)}
        except PortStopped as e:
            return {"status": "stopped", "message": str(e), "stage": e.stage}
        except OSError as e:  # the outputs could not be written: the machine's resources, else this tool's
            why = resource_problem(e)
            if why is None:
                raise
            return {"status": "resource", "message": f"the port's process could not write its outputs: {why}"}


def main(argv: list[str]) -> int:

    if os.environ.get(MEMORY_ENV):  # verify --memory-limit: what the port's process may map
        import resource

        limit = int(os.environ[MEMORY_ENV])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    requests = os.fdopen(int(argv[1]), "rb")
    child = Child(os.fdopen(int(argv[2]), "wb"))
    Handed.port_errors = (BaseException,)  # nothing but the port interrupts this process
    Handed.on_step = lambda step: child.send({"step": step})
    for line in requests:
        try:
            answer = child.handle(wire.loads(line))
        except BaseException as e:  # noqa: BLE001 - outside the port's calls: this tool's failure
            cause = e.__cause__ if isinstance(e, ToolError) and e.__cause__ is not None else e
            answer = {
                "status": "tool",
                "message": describe_exception(e),
                "traceback": "".join(traceback.format_exception(cause)),
            }
        child.send(answer)
        return_freed_memory()  # the port's outputs, freed, are not held while verify compares them
    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv))  # leftover threads of the port do not hold the process
