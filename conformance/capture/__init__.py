"""Verify a model as its author wrote it: load the canonical weights through the user's own
weight mapping, run the model unmodified, and read the stages from outside it.

    port = ModelPort(MyViT, rename={"blocks": "layers", "norm1": "ln_attn", ...})
    verify(port, config)                      # or: python -m conformance verify pkg.mod:port

A ``ModelPort`` is a port factory (``port(config, state, dtype=) -> forward``), so ``verify``,
the ``--port`` plugin and the zoo take it as they take any other. What it adds:

* **Weights through the user's mapping.** A rename table (``{"blocks": "layers", ...}``, a
  segment or a dotted path, ``{i}`` for a block index), a key function, or a whole-state
  ``convert`` function (what ``sanitize`` and ``convert_*_checkpoint`` scripts are). With a
  rename the layouts are converted by the target module's type (MLX and Flax convolutions,
  Flax ``Linear`` kernels, size-1 axes); ``convert`` returns native layouts. Loading is strict:
  a key the model lacks, a shape that does not fit or a canonical key the mapping drops is a
  load error naming it; model parameters the mapping leaves unfilled keep the model's own
  values and are reported, so a port with an extra layer is still located (but for those after
  a declared ``tower``'s output, out of scope: ``conformance.capture.scope``).
* **Taps inferred from the mapping.** The module that receives ``blocks.3.norm1.weight`` is the
  tap ``blocks.3.norm1``; ``attn`` and ``mlp`` are the outputs of the modules holding
  ``attn.proj`` and ``mlp.fc2``, ``mlp.act`` and ``pooled`` the inputs of ``mlp.fc2`` and
  ``head``, ``embed`` the input of block 0, a block the smallest module holding all its
  weights. q, k, v and the attention weights are read where the model computes them: the
  arguments of the fused attention call, the output of the softmax over keys, the operands of
  the q kᵀ and weights·v products; failing that, the outputs of separate q/k/v projections or
  the fused qkv projection split as timm's (3, H, hd). What cannot be seen (the weights inside a
  fused kernel) is listed as unseen with the reason. ``taps=`` overrides or adds entries.
* **Capture from outside**: forward hooks and a ``TorchFunctionMode`` in PyTorch; in MLX and
  Flax NNX each module of interest gets a subclass whose ``__call__`` records (the instance's
  class is swapped for the call and restored), in Flax linen ``nn.intercept_methods``; the
  framework's softmax, fused attention, matmul and scalar multiply are wrapped for the
  duration of the call. Captured tensors are
  copied at once, so a model that updates them in place later (``x += res``) is read right.

The package: ``mapping`` (rename tables, converts), ``adapters`` (one module per framework,
against the ``adapters.base.Adapter`` protocol), ``recorder`` (what a call records), ``plan``
(where each stage is read), ``port`` (``ModelPort`` and the captured forward).
"""

from conformance.capture.adapters import ADAPTERS, Adapter, framework_of
from conformance.capture.mapping import LoadError, rename_function
from conformance.capture.plan import ATTENTION_MODULES, Plan, Source, TapOverrideError, infer_plan
from conformance.capture.captured import CapturedForward
from conformance.capture.port import ModelPort
from conformance.capture.recorder import Taps

__all__ = [
    "ADAPTERS",
    "ATTENTION_MODULES",
    "Adapter",
    "CapturedForward",
    "LoadError",
    "ModelPort",
    "Plan",
    "Source",
    "TapOverrideError",
    "Taps",
    "framework_of",
    "infer_plan",
    "rename_function",
]
