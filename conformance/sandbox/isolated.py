"""The port in a process of its own (``conformance.sandbox.child``): verify's command line runs
every port this way.

The oracle, the error model and the verdict stay in verify's process; the port's module,
factory, model and capture run in the child, which gets each case as array files in a
directory verify owns and answers with its outputs there (``conformance.sandbox.wire``: read
as numbers, never unpickled). Whatever the port does to its interpreter (NumPy patched,
``np.seterr``, threads, ``os.chdir``) stays there. A child that exits, is killed by a signal
(a crash in native code, the out-of-memory killer), or does not answer within ``timeout``
seconds of a call into the port is a finding at the step it was in, and the next case gets a
fresh child (after the same death twice in a row, or a hang, the remaining cases are not run).
Each answer comes within ``timeout`` of the step it answers.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path

import numpy as np

import conformance.sandbox.wire as wire
from conformance.report import CannotJudge, ResourceError, ToolError, UsageError, resource_problem
from conformance.sandbox.handed import Case
from conformance.sandbox.heap import return_freed_memory
from conformance.sandbox.portside import PortStopped  # noqa: F401 - where verify's callers find it
from conformance.sandbox.reap import TOKEN_ENV, kill_marked, new_token
from conformance.support import Unsupported
from impls.protocol import ViTConfig

MEMORY_ENV = "VIT_CONFORMANCE_MEMORY_LIMIT"  # bytes of address space the child may map
CRASH_SIGNALS = {"SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE"}
# Bytes of state above which verify maps the weights it wrote for the port back in place
# of its own (every full-size preset; a small config's cached cases are left as they are).
MAP_BACK = 64 << 20


_LIVE: "weakref.WeakSet[Isolated]" = weakref.WeakSet()  # every port side not yet closed


def close_all() -> None:
    """Close every port side still open: a cancelled run's cleanup, done again where the signal
    interrupted a ``close`` on its way (each close is safe to repeat)."""
    for side in list(_LIVE):
        side.close()


class ChildToolError(ToolError):
    """This tool failed inside the port's process; ``remote_traceback`` is the traceback there."""

    def __init__(self, message: str, remote_traceback: str):
        super().__init__(message)
        self.remote_traceback = remote_traceback


def default_timeout(config: ViTConfig, batch: int = 3) -> float:
    """Seconds for one call into the port: 300, plus a second per GFLOP of a batch's forward (a
    slow CPU framework does several per second; a hung port is found by then)."""
    D, N, depth = config.embed_dim, config.num_tokens, config.depth
    flops = 2 * batch * N * depth * (4 * D * D + 2 * D * config.mlp_hidden_dim + 2 * N * D)
    return 300.0 + flops / 1e9


def death(returncode: int) -> str:
    """What a finished child's status says happened."""
    if returncode >= 0:
        return f"the port's process exited with status {returncode} before returning"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    why = " (out of memory?)" if name == "SIGKILL" else " (a crash in native code)" if name in CRASH_SIGNALS else ""
    return f"the port's process was killed by {name}{why}"


class Isolated:
    """A ``PortSide`` whose port runs in a child process (``kind``: forward, grad or attention;
    ``spec``: pkg.module:name or a built-in port's name)."""

    is_port_side = True

    def __init__(self, kind: str, spec: str, taps=(), timeout: float = 300.0, memory: int | None = None):
        self.kind, self.name, self.taps = kind, spec, list(taps)
        self.timeout, self.memory = float(timeout), memory
        self.inputs = "images"  # what the port's forward takes: told by its process with ``unsupported``
        try:
            self.root = Path(tempfile.mkdtemp(prefix="vit-conformance-"))
        except OSError as e:
            raise ResourceError(
                f"verify cannot create its temporary folder in {tempfile.gettempdir()!r} (TMPDIR): "
                f"{e.strerror or e}; the cases and the port's outputs go there"
            ) from None
        self.token = new_token()  # carried by every process the port starts (``reap``)
        _LIVE.add(self)
        self.proc: subprocess.Popen | None = None
        self.hello: dict | None = None
        self._state: tuple[dict, dict, Path] | None = None  # the current state, its tree and directory
        self._count = 0
        self._stops: list[str] = []  # what ended the child on each case since it last answered
        self.gave_up: str | None = None  # why the remaining cases are not run

    # -- the child

    def __enter__(self) -> Isolated:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._kill()
        kill_marked(self.token)  # what an earlier port process started and left
        shutil.rmtree(self.root, ignore_errors=True)
        _LIVE.discard(self)

    def _kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its leftover threads and children too
        except ProcessLookupError:
            pass
        self.proc.wait()
        kill_marked(self.token, self.proc.pid)  # and what it started in sessions of their own
        try:
            self._requests.close()
        except OSError:  # what it was not sent: nobody reads it now
            pass
        answers, self._answers = self._answers, None  # never closed twice: its number may be reused
        if answers is not None:
            os.close(answers)
        self.proc = None

    def _spawn(self) -> None:
        requests_read, requests_write = os.pipe()
        answers_read, answers_write = os.pipe()
        env = dict(os.environ)
        # the port is imported as it would be here: this process's import path, first
        path = [os.path.abspath(p or os.curdir) for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path + env.get("PYTHONPATH", "").split(os.pathsep)))
        if self.memory:
            env[MEMORY_ENV] = str(int(self.memory))
        env[TOKEN_ENV] = self.token
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "conformance.sandbox.child", str(requests_read), str(answers_write)],
            pass_fds=(requests_read, answers_write),
            stdin=subprocess.DEVNULL,
            stdout=2,  # the port's prints go to this process's standard error: stdout is the report's
            env=env,
            start_new_session=True,  # its own process group: killed whole; the terminal's Ctrl-C is verify's
        )
        os.close(requests_read)
        os.close(answers_write)
        self._requests = os.fdopen(requests_write, "wb")
        self._answers, self._buffer = answers_read, b""

    def start(self) -> dict:
        """Start the child and import the port: its hello (the default config), or raise
        ``UsageError`` (the port cannot be loaded) or ``PortStopped``."""
        self._spawn()
        answer, step, stopped = self._ask({"op": "hello", "kind": self.kind, "spec": self.name, "taps": self.taps})
        if stopped:
            raise PortStopped(f"{stopped} (while importing {self.name!r})")
        if answer["status"] != "ok":  # the port did not load: its process is of no further use
            self._kill()
        self._check(answer)
        self.hello = answer
        return answer

    def _ask(self, message: dict) -> tuple[dict | None, str | None, str | None]:
        """(answer, the last step the child announced, None), or (None, step, what stopped it)."""
        try:
            self._requests.write(wire.dumps(message))
            self._requests.flush()
        except BrokenPipeError:  # it ended before it was asked
            why = death(self.proc.wait())
            self._kill()
            return None, None, why
        step = None
        while True:
            line = self._line()
            if isinstance(line, str):  # no line: what stopped the child
                self._kill()
                return None, step, line
            try:
                answer = wire.loads(line)
            except wire.WireError as e:
                self._kill()
                return None, step, f"the port's process sent what verify cannot read ({e})"
            if isinstance(answer, dict) and set(answer) == {"step"}:
                step = str(answer["step"])
                continue
            if not isinstance(answer, dict) or "status" not in answer:
                self._kill()
                return None, step, "the port's process sent what verify cannot read (no status)"
            return answer, step, None

    def _line(self) -> bytes | str:
        """The next line from the child within the timeout, or why none came."""
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._answers], [], [], self.timeout)
            if not ready:
                return f"no answer in {self.timeout:g} s"
            chunk = os.read(self._answers, 1 << 20)
            if not chunk:
                return death(self.proc.wait())
            self._buffer += chunk
            if len(self._buffer) > wire.MAX_MESSAGE:
                return f"the port's process sent more than {wire.MAX_MESSAGE} bytes without a line end"
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _check(self, answer: dict) -> None:

        status = answer.get("status")
        if status == "tool":
            raise ChildToolError(
                f"in the port's process: {answer.get('message', '')}", str(answer.get("traceback", ""))
            )
        if status == "unsupported":
            raise Unsupported(str(answer.get("message", "")))
        if status == "usage":
            error = (CannotJudge if answer.get("cannot_judge") else UsageError)(str(answer.get("message", "")))
            error.label = str(answer.get("label", UsageError.label))  # the config's, or the user's input
            raise error
        if status == "stopped":
            raise PortStopped(str(answer.get("message", "")), str(answer.get("stage", "import")))
        if status == "resource":
            raise ResourceError(str(answer.get("message", "")))
        if status != "ok":
            raise ChildToolError(f"an answer of status {status!r} from the port's process", "")

    # -- the port side

    def default_config(self) -> ViTConfig | None:
        hello = self.hello or self.start()
        return None if hello.get("default_config") is None else ViTConfig.from_dict(hello["default_config"])

    def unsupported(self, config: ViTConfig) -> str | None:
        if self.proc is None:
            self.start()
        answer, _, stopped = self._ask({"op": "unsupported", "config": config.to_dict()})
        if stopped:
            raise PortStopped(stopped)
        self._check(answer)
        self.inputs = answer.get("inputs", "images")
        return answer.get("why")

    def _writer(self) -> wire.Writer:
        self._count += 1
        return wire.Writer(self.root, self._count)

    def _written(self, state: dict) -> bool:
        """Whether ``state``'s arrays, every one, are those last written."""
        if self._state is None:
            return False
        refs = self._state[0]
        return refs.keys() == state.keys() and all(
            r is not None and r() is v for r, v in ((refs[k], state[k]) for k in state)
        )

    def _case_tree(self, case: Case) -> tuple[dict, wire.Writer]:
        """The case as a tree under the root (its state written once for every case sharing it)."""
        if not self._written(case.state):  # consecutive cases share it: written once
            if self._state is not None:
                shutil.rmtree(self._state[2], ignore_errors=True)
            state_writer = self._writer()
            tree = state_writer.encode(dict(case.state))
            if sum(np.asarray(v).nbytes for v in case.state.values()) > MAP_BACK:
                # verify reads a large state back from the files it wrote, mapped: one copy of the
                # weights, in the page cache the port's process maps too (the case's own dict,
                # which the error model reads, holds the mapped arrays from here on)
                case.state.update(wire.Reader(self.root, mmap=True).decode(tree))
                # the weights just replaced were freed into verify's heap, which keeps freed memory
                # for reuse (``heap.keep_freed_memory``): given back before the port's forward, the
                # run's peak, instead of after the case (a ViT-g/14 weight set is 4.5 GB)
                return_freed_memory()
            # the arrays known by weak reference: the last case's weights are not held into the next's
            refs = {k: weakref.ref(v) if isinstance(v, np.ndarray) else None for k, v in case.state.items()}
            self._state = (refs, tree, state_writer.root / state_writer.sub)
        writer = self._writer()
        tree = {
            "name": case.name,
            "images": writer.encode(case.images),
            "state": self._state[1],
            "context": writer.encode(case.context),
            "mask": writer.encode(case.mask),
            "patch_coord": writer.encode(case.patch_coord),
            "patch_valid": writer.encode(case.patch_valid),
        }
        return tree, writer

    def _short_of(self, e: OSError, case: Case) -> Exception:
        """A case verify could not write for the port: the machine's resources (exit 2, with the
        figure needed), else the error itself (the tool's)."""

        why = resource_problem(e)
        if why is None:
            return e
        need = case.images.nbytes + sum(np.asarray(v).nbytes for v in case.state.values())
        free = shutil.disk_usage(self.root).free
        return ResourceError(
            f"verify cannot write a case for the port in {str(self.root.parent)!r} (TMPDIR): {why}; a case's "
            f"weights and images take {need / 1e6:.3g} MB and the port's outputs as much again, {free / 1e6:.3g} MB free"
        )

    def _stopped(self, step: str, why: str):
        """A case the child did not answer: a hang ends the run (every case would wait as long);
        so does the same death on two cases in a row (a fresh child each time)."""
        self._stops.append(why)
        if why.startswith("no answer") or self._stops[-2:] == [why, why]:
            self.gave_up = why
        return None, [(step, why)]

    def _run(self, op: str, case: Case, stage: str, **extra):
        if self.gave_up:
            return None, [(stage, f"not run: {self.gave_up} on an earlier case")]
        if self.proc is None:
            try:
                self.start()
            except PortStopped as e:
                return self._stopped("import", str(e))
        try:
            tree, writer = self._case_tree(case)
        except OSError as e:
            raise self._short_of(e, case) from None
        self._count += 1
        out = str(self._count)
        scratch = [writer.root / writer.sub, self.root / out]
        if "loss" in extra:  # the loss's arrays beside the case's
            loss = extra["loss"]
            extra["loss"] = {
                "kind": loss.kind,
                "labels": writer.encode(loss.labels),
                "weights": writer.encode(loss.weights),
            }
        request = {"op": op, "case": tree, "root": str(self.root), "out": out, **extra}
        try:
            answer, step, stopped = self._ask(request)
            if stopped:
                return self._stopped(step or stage, stopped)
            self._stops.clear()
            self._check(answer)
            try:
                # mapped, not read: a full-size case's taps come into memory a stage at a time as
                # they are judged (``mapped.let_go``); the mapping outlives the files removed below
                result = wire.Reader(self.root, mmap=True).decode(answer.get("out"))
            except (wire.WireError, OSError, ValueError) as e:
                return None, [(step or stage, f"the port's process sent what verify cannot read ({e})")]
            return result, [(str(s), str(r)) for s, r in answer.get("findings", [])]
        finally:
            for path in scratch:
                shutil.rmtree(path, ignore_errors=True)

    def forward(self, case: Case, config: ViTConfig, dtype: str):
        return self._run("forward", case, "forward", config=config.to_dict(), dtype=dtype)

    def twice(self, case: Case, config: ViTConfig, dtype: str):
        return self._run("twice", case, "forward", config=config.to_dict(), dtype=dtype)

    def backward(self, case: Case, config: ViTConfig, dtype: str, loss):
        return self._run("backward", case, "backward", config=config.to_dict(), dtype=dtype, loss=loss)

    def attention(self, case: Case, options: dict):
        return self._run("attention", case, "forward", options=dict(options))
