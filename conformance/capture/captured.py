"""The captured forward a ModelPort builds: one run of the unmodified model, every planned
stage read from outside it (a module's input or output, the attention record of a block, the
return value). It knows the port by the attributes it reads (``images``, ``output``,
``patch_order``, ``sequence``, ``prefix``), not by its type: conformance.capture.port imports it."""

from __future__ import annotations

import numpy as np

from conformance.capture.adapters import BaseAdapter
from conformance.capture.expressible import windowed
from conformance.capture.mapping import patches_to_canonical
from conformance.capture.plan import Plan, Source
from conformance.capture.sequence import heads_first, prefix_first, unpack_sequence
from conformance.capture.reading import Never, Unseen, read_attention, to_tap_shape, windowed_blocks
from conformance.capture.recorder import Recorder, Taps, arrays_in, merge_second
from conformance.report import ToolError, describe_exception
from impls.protocol import ViTConfig, tap_names, tap_shapes
from impls.stages import stage_of


class CapturedForward:
    """forward(images) -> Taps: runs the unmodified model once and reads every planned tap."""

    def __init__(self, port, adapter: BaseAdapter, plan: Plan, config: ViTConfig, dtype: str, findings):
        self.port, self.adapter, self.plan, self.config, self.dtype = port, adapter, plan, config, dtype
        self.findings = findings
        self.input_dtype = dtype
        self._emitted: str | None = None
        self.fast_paths = adapter.fast_paths()  # the model's modules do not change between calls
        self.k_bias: dict[int, np.ndarray] = {}  # block -> qkv.bias of a model without k bias (ModelPort._k_bias_free)
        self.quantized = None  # ModelPort(quantize=): its weights read back (conformance.capture.quantized)
        self.compiled = False  # a call met a compiled function's placeholders (then every call is read so)
        self.observed: list | None = None  # the arrays the last call's own pass returned (the framework's)
        self.shapes: dict = {}  # each stage's tap shape for the images of the call

    def __call__(self, images) -> Taps:
        images = np.asarray(images)
        x = images.transpose(0, 2, 3, 1) if self.port.images == "NHWC" else images
        inputs = self.adapter.to_input(np.ascontiguousarray(x), self.input_dtype)
        c = self.config
        self.shapes = tap_shapes(c, images.shape[0], images.shape[2:] if c.dynamic_img_size else None)
        self.adapter.path = None
        if not self.fast_paths:
            taps = self._pass(inputs, images.shape[0], functions=True)
            taps.path = self.adapter.path
        else:
            # The model's own path first (hooks only: its native kernels run as for its user), then
            # the internals those kernels hide, read in a second pass that leaves them; both are judged.
            taps = self._pass(inputs, images.shape[0], functions=False)
            path = self.adapter.path
            second = self._pass(inputs, images.shape[0], functions=True, own=False)
            merge_second(taps, second, "in a second pass under a TorchFunctionMode")
            taps.path = path
        taps.quantized = self.quantized
        if self.adapter.recompiled and "logits" in taps.sources:  # told, never silent
            taps.sources["logits"] += (
                f"; the compiled forward compiled again for an input it had compiled for ({self.adapter.recompiled})"
            )
        if not self.compiled and not any(why == self.adapter.TRACED for why in taps.unseen.values()):
            return taps
        # Stages inside a compiled function are placeholders of its trace (and later calls run no
        # Python there): the compiled forward gives the output, judged end to end, and a pass with
        # compilation off every stage, judged as a second pass's
        self.compiled = True
        own = self._pass(inputs, images.shape[0], functions=False, watch=False)
        with self.adapter.uncompiled():
            second = self._pass(inputs, images.shape[0], functions=True, own=False)
        merge_second(own, second, "in a second pass with compilation off")
        own.quantized = self.quantized
        return own

    def _pass(self, inputs, batch: int, functions: bool, watch: bool = True, own: bool = True) -> Taps:
        """The stages one call shows (``watch=False``: the model's output alone, no hooks)."""
        recorder = Recorder(self.adapter, self.config, batch, self.plan.blocks)
        out = self.adapter.run(inputs, recorder, self.plan.watch() if watch else {}, functions=functions)
        recorder.raise_error()
        # one sequence of whole images: a fused call on fewer than an image's tokens is a window,
        # where the oracle attends over the whole image
        windows = windowed_blocks(recorder, self.config.num_tokens) if self.port.sequence != "batch" else None
        if windows and self.config.window_partition != "truncate":
            raise windowed(windows, self.config)
        if own:  # the model's own path (not a second pass off it): what ``unobserved`` compares with
            self.observed = arrays_in(out, self.adapter.is_array)
        taps = Taps(unseen=self.plan.unseen, findings=list(self.findings))
        shapes = self.shapes
        for stage in tap_names(self.config):
            source = self.plan.sources.get(stage)
            if source is None:
                continue
            if not watch and source.kind != "return":
                taps.unseen[stage] = "inside the model's compiled forward"
                continue
            try:
                self._emitted = None
                value, where = self._read(source, stage, recorder, out, shapes.get(stage))
            except Unseen as e:
                why = str(e)
                if not functions and source.kind == "attn" and "native" not in why:
                    why = "not read there: it runs with hooks only (and took no native kernel)"
                taps.unseen[stage] = why
                continue
            except Never as e:
                taps.findings.append((stage, str(e)))
                continue
            except Exception as e:  # noqa: BLE001 - reading a recorded tensor is the tool's job
                if self.adapter.traced(e):
                    taps.unseen[stage] = self.adapter.TRACED
                    continue
                raise ToolError(
                    f"capture failed reading stage {stage} ({source.kind} {source.path or ''}".rstrip()
                    + f"): {describe_exception(e)}"
                ) from e
            if self.port.sequence != "batch" and source.kind != "return":
                c, merge = self.config, 2 if self.port.sequence == "merge2x2" else 1
                window = c.window_size if c.window_partition == "truncate" and self._in_blocks(source) else 0
                value = unpack_sequence(
                    value, batch, c.num_tokens, c.grid_size, merge, stage.endswith("weights"), window
                )
            value = to_tap_shape(value, shapes.get(stage))
            if self.port.prefix == "last":
                c = self.config
                value = prefix_first(value, stage_of(stage)[0].shape, c.num_prefix_tokens, c.num_tokens)
            block = int(stage.split(".")[1]) if stage.endswith(".attn.k") else None
            if block in self.k_bias:
                value, where = self._k_bias_added(value, block), f"{where}, plus the k bias its model has not"
            taps[stage] = value
            taps.sources[stage] = where
            if self._emitted:
                taps.dtypes[stage] = self._emitted
        return taps

    def _in_blocks(self, source: Source) -> bool:
        """Whether a stage is read in the blocks (their inputs too): where a tower with windows cut at
        the edge (Qwen2.5-VL's) runs its sequence in window order, reordered after the patch embedding."""
        path = source.path or ""
        return source.kind == "attn" or any(path == b or path.startswith(f"{b}.") for b in self.plan.blocks)

    def _k_bias_added(self, k, block: int):
        c = self.config
        b_k = self.k_bias[block][c.embed_dim : 2 * c.embed_dim].reshape(1, c.num_heads, 1, c.head_dim)
        return (np.asarray(k, np.float64) + b_k).astype(np.asarray(k).dtype)

    def boundary_taps(self, recorder: Recorder, logits_grad) -> dict[str, np.ndarray]:
        """Every stage this forward reads at a module boundary (a module's input or output, the
        return value), read from a recorder holding cotangents instead of values: the same reshapes."""
        taps = {}
        for stage in tap_names(self.config):
            source = self.plan.sources.get(stage)
            if source is None or source.kind not in ("in", "out", "return"):
                continue
            try:
                taps[stage] = logits_grad if source.kind == "return" else self._read(source, stage, recorder, None)[0]
            except (Unseen, Never):
                continue
        return taps

    def logits(self, out):
        """The logits in the model's output: ``output=``, else its first array."""
        return self.port.output(out) if self.port.output else arrays_in(out, self.adapter.is_array)[0]

    def _np(self, x) -> np.ndarray:
        """A recorded array as NumPy, noting the dtype the model emitted it in."""
        self._emitted = str(getattr(x, "dtype", "")).rsplit(".", 1)[-1]
        return self.adapter.numpy(x)

    def _array(self, x, stage):
        arrays = arrays_in(x, self.adapter.is_array)
        if not arrays:
            raise Unseen(f"its module returned {type(x).__name__}, not an array")
        return arrays[0]

    def _read(self, source: Source, stage: str, rec: Recorder, out, shape=None):
        """``shape``: the stage's tap shape (a windowed block's attention: its windows)."""
        c = self.config
        B = rec.B
        if source.kind == "return":
            logits = self.port.output(out) if self.port.output else self._array(out, stage)  # names an empty output
            if source.part == "pooled" and len(getattr(logits, "shape", ())) == 3:
                raise Never(
                    f"a headless model's output is its pooled features (B, D); it returned "
                    f"{tuple(logits.shape)} tokens: give ModelPort(output=...) its pooled output"
                )
            what = "the model's return value" + (" (a headless model's pooled features)" if source.part else "")
            return self._np(logits), what
        if source.kind in ("in", "out"):
            store = rec.inputs if source.kind == "in" else rec.outputs
            if source.path not in store:
                raise Never(
                    f"the module {source.path!r} that holds its weights was never called: its weights "
                    "take no part in the forward"
                )
            x = self._np(self._array(store[source.path], stage))
            where = f"{'input' if source.kind == 'in' else 'output'} of {source.path}"
            if source.shape == "patches" and x.ndim == 4:
                if self.adapter.channels_first:  # a convolution's (B, D, gh, gw)
                    x = x.reshape(B, c.embed_dim, -1).transpose(0, 2, 1)
                else:
                    x = x.reshape(B, -1, c.embed_dim)
            if source.shape == "bias":  # the weights' alone, (1, H, N, N) or (H, N, N): over the batch
                x = np.broadcast_to(x, (B, *x.shape[-3:]))
            if source.shape == "heads":
                x = heads_first(x, c)
            if source.shape == "patch_order":
                x = patches_to_canonical(x, c, self.port.patch_order)
            if not source.shape and x.ndim == 3 and x.shape[:2] == (rec.N, B) != (B, rec.N):
                # a sequence-first residual stream (OpenAI's CLIP, nn.MultiheadAttention(batch_first=False))
                x, where = x.swapaxes(0, 1), f"{where}, sequence first (N, B, D)"
            return x, where
        return read_attention(source, rec, self.config, self._np, lambda x: self._array(x, stage), shape)
