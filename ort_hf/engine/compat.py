"""Every bridge between onnxruntime-training 1.19.2 and today's torch lives here.

ORTModule 1.19.2 (Sep 2024) is the last release and was written against torch <= 2.4.
Each bridge says what moved, in which torch version, and when it can go. Bridges are
applied once, by :func:`apply_torch_bridges` (before ORTModule is imported) and
:func:`apply_ort_bridges` (right after), on first use of the engine, never on
``import ort_hf``. None changes what code outside an ORTModule export sees.

The one piece of transformers that ORTTrainer re-states rather than calls, the parent's handling
of a computed loss (:func:`loss_as_trainer_returns`), is here too, so a version bump is checked
in one file.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import threading
import time
import types
import warnings

from . import shape_pass
from .export_record import ACTIVE_EXPORT_RECORD

_lock = threading.Lock()
_torch_done = False
_ort_done = False


def _alias_module(public_name: str, real_name: str) -> None:
    """Make ``import public_name`` and ``parent.attr`` resolve to ``real_name``."""
    if public_name in sys.modules:
        return
    module = importlib.import_module(real_name)
    sys.modules[public_name] = module
    parent_name, _, attr = public_name.rpartition(".")
    parent = importlib.import_module(parent_name)
    if not hasattr(parent, attr):
        setattr(parent, attr, module)


def _patch(owner, name: str, make_wrapper, static: bool = False) -> None:
    """Replace ``owner.name`` by ``make_wrapper(original)`` once (a second call is a no-op): the
    wrapper keeps the original's name and signature (``functools.wraps``; ORT inspects some)."""
    original = getattr(owner, name)
    if getattr(original, "_ort_hf_bridge", False):
        return
    wrapper = functools.wraps(original)(make_wrapper(original))
    wrapper._ort_hf_bridge = True
    setattr(owner, name, staticmethod(wrapper) if static else wrapper)


def _bridge_torch_onnx_modules() -> None:
    # torch 2.9 moved the TorchScript exporter to torch.onnx._internal.torchscript_exporter
    # (pytorch#148252 and follow-ups); ORT 1.19.2 imports the old paths
    # torch.onnx._internal.jit_utils, torch.onnx._type_utils and torch.onnx._globals.
    # Can go when ORTModule is dropped or patched upstream (no upstream release will come).
    new = "torch.onnx._internal.torchscript_exporter"
    _alias_module("torch.onnx._internal.jit_utils", f"{new}.jit_utils")
    _alias_module("torch.onnx._type_utils", f"{new}._type_utils")
    _alias_module("torch.onnx._globals", f"{new}._globals")
    _alias_module("torch.onnx._internal.registration", f"{new}.registration")
    # torch 2.5 removed torch.onnx._internal._beartype (it was an identity decorator once
    # beartype checking was off, which it always was in releases). ORT only uses it to
    # decorate one function for ZeRO-3; an identity stand-in keeps that import working.
    if "torch.onnx._internal._beartype" not in sys.modules:
        beartype = types.ModuleType("torch.onnx._internal._beartype")
        beartype.beartype = lambda fn: fn
        sys.modules[beartype.__name__] = beartype
        import torch.onnx._internal as internal

        internal._beartype = beartype
    # torch 2.9 left torch.onnx.symbolic_opset9 as a re-export of the moved module's public
    # names only; ORT's aten::_convolution / _convolution_mode symbolics import the private
    # helpers from the old path (every Conv model failed to export with an ImportError).
    # Can go with the aliases above.
    import torch.onnx.symbolic_opset9 as public_opset9

    moved_opset9 = importlib.import_module(f"{new}.symbolic_opset9")
    for name in ("_convolution", "_convolution_mode"):
        if not hasattr(public_opset9, name):
            setattr(public_opset9, name, getattr(moved_opset9, name))


def _bridge_exporter_default() -> None:
    # torch 2.9 switched torch.onnx.export to dynamo=True by default. ORTModule needs the
    # TorchScript exporter (its symbolics, PythonOp export and autograd_inlining only exist
    # there) but never passes `dynamo`. Only calls made inside ORTModule's export context get
    # dynamo=False; every other caller sees torch's own default. functools.wraps keeps the
    # real signature visible: ORT inspects it for `autograd_inlining`.
    # Can go when ORTModule passes dynamo=False itself (never, upstream is frozen).
    import torch.onnx

    _patch(torch.onnx, "export", _export_with_dynamo_off)


def _export_with_dynamo_off(original):
    def export(*args, **kwargs):
        ortmodule = sys.modules.get("onnxruntime.training.ortmodule")
        in_ort_export = ortmodule is not None and ortmodule.ORTMODULE_ONNX_EXPORT_CONTEXT[0]
        if not in_ort_export:
            return original(*args, **kwargs)
        kwargs.setdefault("dynamo", False)
        record = ACTIVE_EXPORT_RECORD.get()
        start = time.perf_counter()
        try:
            with shape_pass.weights_withheld():  # not a version bridge: ORT's export memory (shape_pass.py)
                return original(*args, **kwargs)
        finally:
            if record is not None:
                record.export_count += 1
                record.export_seconds += time.perf_counter() - start

    return export


@contextlib.contextmanager
def without_unused_deepspeed():
    """Import ORTModule without importing DeepSpeed when nothing else did.

    ORTModule 1.19.2's ``__init__`` imports DeepSpeed, when installed, only to wrap
    ``deepspeed.checkpointing.checkpoint`` for export, and its ZeRO-3 offload hooks
    (``training.utils.hooks``, imported at the first export) import it too; that costs every ORT
    run a DeepSpeed import and its "Setting accelerator to CPU" banner. A process that uses
    DeepSpeed has imported it before (transformers does for ``--deepspeed``) and gets ORT's wrapper
    as before; ORTTrainer replaces activation checkpointing by ORT's recompute in any case.

    The ZeRO-3 offload hooks import a DeepSpeed internal that moved
    (``_apply_to_tensors_only``) and warn "DeepSpeed import error ..." whenever DeepSpeed is
    installed; ort_hf refuses ZeRO-3, so the hooks never run and the warning, about nothing in
    the user's run, is not shown. Can go with ORTModule."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="DeepSpeed import error", category=UserWarning)
        if "deepspeed" in sys.modules:
            yield
            return
        sys.modules["deepspeed"] = None  # `import deepspeed` raises ImportError, which ORT suppresses
        try:
            yield
        finally:
            if sys.modules.get("deepspeed", 0) is None:
                del sys.modules["deepspeed"]


def apply_torch_bridges() -> None:
    """Bridges that must be in place before ``onnxruntime.training.ortmodule`` imports."""
    global _torch_done
    with _lock:
        if _torch_done:
            return
        _bridge_torch_onnx_modules()
        _bridge_exporter_default()
        import torch

        _patch(torch._C, shape_pass.PASS, shape_pass.without_weight_values)
        _torch_done = True


def _bridge_cpu_nvtx() -> None:
    # torch.cuda.nvtx.range_push raises on CPU builds of torch (since ~2.2 the stub raises
    # "NVTX functions not installed"); ORT calls it unconditionally around every forward and
    # backward. Replace ORT's helpers, wherever ORT imported them by name, with versions
    # that do nothing when CUDA is unavailable. Can go with ORTModule.
    import torch
    from onnxruntime.training.utils import torch_profile_utils as tpu

    if getattr(tpu.torch_nvtx_range_push, "_ort_hf_bridge", False):
        return
    original_push, original_pop = tpu.torch_nvtx_range_push, tpu.torch_nvtx_range_pop

    def push(msg):
        if torch.cuda.is_available():
            original_push(msg)

    def pop():
        if torch.cuda.is_available():
            original_pop()

    push._ort_hf_bridge = pop._ort_hf_bridge = True
    replacements = {id(original_push): push, id(original_pop): pop}
    for name, module in list(sys.modules.items()):
        if not name.startswith("onnxruntime.training") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in replacements:
                setattr(module, attr, replacements[id(value)])


def _bridge_sparsity_switches() -> None:
    # ORT 1.19.2 bugs, both in GraphTransitionManager: (a) the label-sparsity hook is gated by
    # the *embedding* switch, so ORTMODULE_ENABLE_LABEL_SPARSE_OPTIMIZER=0 is ignored; (b) when
    # that switch is off the hook returns None, and export then iterates None
    # ("TypeError: 'NoneType' object is not iterable"), so ENABLE_EMBEDDING_SPARSE_OPTIMIZER=0
    # and ENABLE_COMPUTE_OPTIMIZER=0 crash. The wrapper gates the label hook by the active
    # model's own label switch and always returns a list. Can go with ORTModule.
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager as GTM

    def wrap(original):
        def add_label_hook(enable_flag_from_ort, logger, runtime_inspector, flattened_module):
            record = ACTIVE_EXPORT_RECORD.get()
            enabled = record.enable_label_sparsity if record is not None else enable_flag_from_ort
            if record is not None:
                record.runtime_inspector = runtime_inspector  # an export-cache hit notes its flags there
            return original(enabled, logger, runtime_inspector, flattened_module) or []

        return add_label_hook

    _patch(GTM, "_add_check_label_sparsity_hook", wrap, static=True)


def _bridge_mem_efficient_grad_device() -> None:
    # ORT 1.19.2 bug: GraphTransitionManager passes the dict of parameter names as the `device`
    # argument of post_processing_enable_mem_efficient_training, so memory-efficient gradient
    # management fails with "zeros(): argument 'device' must be torch.device, not dict". The
    # device is taken from the parameters instead. Can go with ORTModule.
    import torch
    from onnxruntime.training.ortmodule import _mem_efficient_grad_mgmt as mgmt

    def wrap(original):
        def post_processing(exported_model, named_params, device):
            named_params = list(named_params)
            if not isinstance(device, torch.device):
                device = named_params[0][1].device if named_params else "cpu"
            return original(exported_model, named_params, device)

        return post_processing

    _patch(mgmt, "post_processing_enable_mem_efficient_training", wrap)


def _bridge_frozen_parameters() -> None:
    # ORT 1.19.2 bug: GraphTransitionManager._export_model (_graph_transition_manager.py:772-777)
    # lists every parameter the graph reads as requiring a gradient, frozen or not, and leaves the
    # correction to _reprocess_check (:556) on a later forward; but ORT's default skip-check policy
    # (options.py:303, SKIP_CHECK_BUILD_GRADIENT) never calls it again after the first export
    # (_training_manager.py:248). So the gradient graph computes a gradient for every frozen weight
    # (LoRA's whole base model, a frozen embedding or encoder) and ORT drops them. The list is
    # cut here to the parameters that require grad at export, which is what _reprocess_check would
    # compute (user inputs keep ORT's own rule); a later change of requires_grad is caught by
    # recheck_trainable below. Can go with ORTModule.
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager as GTM

    def wrap(original):
        def export_model(**kwargs):
            exported, schema, input_names, require_grad = original(**kwargs)
            frozen = {name for name, p in kwargs["flattened_module"].named_parameters() if not p.requires_grad}
            return exported, schema, input_names, [name for name in require_grad if name not in frozen]

        return export_model

    _patch(GTM, "_export_model", wrap, static=True)


def _bridge_post_export_repairs() -> None:
    # Four ORT 1.19.2 gradient-builder failures, repaired on the post-export model before ORT
    # builds the gradient graph (graph_repairs.py says why each rewrite is exact):
    # (a) PropagateCastOps fails to remove a Cast to the type its input has when its output feeds
    #     one node twice ("Argument mismatch when removing edge", graph.cc:1591: gated delta-net
    #     layers' l2norm); such casts are dropped here;
    # (b) a tensor no gradient reaches, read by two Concats, gets its gradient defined twice (the
    #     Concat gradient writes one for every input: "Duplicate definition of name (..._grad)",
    #     Inkling2's empty zero block state); Concat inputs of size 0 on the axis are dropped;
    # (c) ORT differentiates through every float input of a PythonOp, also those whose Function's
    #     backward returns None, whose producers' gradient kernels then miss their input ("Missing
    #     Input: ..._grad", PhiMoE's GatherElementsGrad); such inputs are read through a detach;
    # (d) a trainable parameter with no differentiable path to the outputs (a sparse-attention
    #     indexer's weights, read only through TopK indices) aborts the build ("Cannot compute the
    #     partial derivative ... unreachable"); it is left out of what ORT differentiates, so its
    #     .grad stays None as in PyTorch. Only the post-processed list changes: the exported one
    #     stays what _reprocess_check compares with (recheck_trainable). Can go with ORTModule.
    # With the export cache on, the repaired graph is kept in the cache entry (processed_cache).
    import torch
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager as GTM

    from . import processed_cache
    from .graph_repairs import detach_function_inputs, drop_empty_concat_inputs, drop_noop_casts, unreachable_parameters

    def repair(model):
        drop_noop_casts(model)
        drop_empty_concat_inputs(model)
        detach_function_inputs(model)

    def wrap(original):
        def post_export_process(**kwargs):
            info = processed_cache.post_process(original, kwargs, repair)
            model = info._post_export_processed_model
            if kwargs["export_mode"] == torch.onnx.TrainingMode.TRAINING:
                parameters = {name for name, _ in kwargs["flatten_module"].named_parameters()}
                required = info.onnx_graph_input_names_require_grad
                unreachable = set(unreachable_parameters(model, [n for n in required if n in parameters]))
                if unreachable:
                    info.onnx_graph_input_names_require_grad = [n for n in required if n not in unreachable]
                    kwargs["logger"].info(
                        "ort_hf: no gradient path from the outputs to %s: their .grad stays None, as in PyTorch.",
                        ", ".join(sorted(unreachable)),
                    )
            return info

        return post_export_process

    _patch(GTM, "_post_export_process", wrap, static=True)


def _bridge_padding_elimination() -> None:
    # ORT 1.19.2's padding elimination (graph transformer and kernels) is in its CUDA build only.
    # The exported forward graph is rewritten here, before ORT builds the gradient graph from it,
    # when the wrapped model's forward asked for it (wrap.py decides per graph build).
    import torch
    from onnxruntime.training.ortmodule._graph_execution_manager import GraphExecutionManager as GEM

    from .padding_elimination import eliminate_padding

    def wrap(original):
        def initialize_graph_builder(self, post_export_processed_model_info):
            record = ACTIVE_EXPORT_RECORD.get()
            # Only a training graph's build says what the training graph is: an inference graph
            # (eval_in_ort) built later must not clear the guard of the rewritten training graph.
            if record is not None and self._export_mode == torch.onnx.TrainingMode.TRAINING:
                record.padding_rewrite = None
                if record.eliminate_padding:
                    info = post_export_processed_model_info
                    info._post_export_processed_model, record.padding_rewrite = eliminate_padding(
                        info._post_export_processed_model
                    )
            return original(self, post_export_processed_model_info)

        return initialize_graph_builder

    _patch(GEM, "_initialize_graph_builder", wrap)


def _bridge_gradient_graph_cache() -> None:
    # With the export cache on, ORT's built training graph and its GraphInfo are kept in the cache
    # entry and a later build of the same graph with the same settings loads them
    # (gradient_graph_cache). TrainingManager._build_graph calls this base method through super().
    from onnxruntime.training.ortmodule._graph_execution_manager import GraphExecutionManager as GEM

    from . import gradient_graph_cache

    def wrap(original):
        def build_graph(self, config):
            return gradient_graph_cache.build_graph(original, self, config)

        return build_graph

    _patch(GEM, "_build_graph", wrap)


def _bridge_session_graph_cache() -> None:
    # With the export cache on, a CPU training session's optimised graph is kept in the cache entry
    # and a later session of the same graph, options and CPU loads it with ORT's optimisers off
    # (session_graph_cache). ORT 1.19.2 passes TrainingAgent's arguments by position.
    import inspect

    from onnxruntime.training.ortmodule._execution_agent import TrainingAgent

    from . import session_graph_cache

    def wrap(original):
        signature = inspect.signature(original)

        def init(*args, **kwargs):
            session_graph_cache.create_agent(original, signature.bind(*args, **kwargs))

        return init

    _patch(TrainingAgent, "__init__", wrap)


def _bridge_shape_inference_non_finite() -> None:
    # ORT 1.19.2 bug: its symbolic shape inference (tools/symbolic_shape_infer.py) carries small
    # constants along (Cast, Concat, Squeeze, ...) as shape data and converts each to a Python int
    # (_get_int_or_float_values), so a constant infinity or NaN aborts the export with
    # "OverflowError: cannot convert float infinity to integer". torch's scatter symbolic casts a
    # scalar fill value (PhiMoE's router: torch.scatter(scores, -1, idx, float("-inf"))) to the
    # tensor's type, which makes exactly such a Cast. A non-finite value never is a shape: nodes
    # reading one get no shape data, as for any value it does not know. Can go with ORTModule.
    import numpy as np
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    def wrap(original):
        def get_int_or_float_values(self, node, broadcast=False, allow_float_values=False):
            for i in range(len(node.input)):
                value = self._try_get_value(node, i)
                if isinstance(value, np.ndarray) and value.dtype.kind == "f" and not np.isfinite(value).all():
                    return [None] * len(node.input)
            return original(self, node, broadcast, allow_float_values)

        return get_int_or_float_values

    _patch(SymbolicShapeInference, "_get_int_or_float_values", wrap)


@contextlib.contextmanager
def recheck_trainable(training_manager):
    """Let ORT compare, on the forward run inside, which parameters require grad with the ones its
    gradient graph was built for, and rebuild the graph and session (no re-export) if they differ.

    ORT's default skip-check policy skips that comparison after the first export (see
    _bridge_frozen_parameters): a parameter unfrozen later would get no gradient. The caller
    enters this only when requires_grad changed, so steps keep ORT's fast path. Can go with
    ORTModule."""
    from onnxruntime.training.ortmodule.options import _SkipCheck

    options = training_manager._runtime_options
    saved = options.skip_check
    # Both: the second creates the new session for the rebuilt graph (_training_manager.py:274).
    options.skip_check = _SkipCheck(
        saved & ~(_SkipCheck.SKIP_CHECK_BUILD_GRADIENT | _SkipCheck.SKIP_CHECK_EXECUTION_AGENT)
    )
    try:
        yield
    finally:
        options.skip_check = saved


def make_sampler_reusable(sampler) -> None:
    """ORT 1.19.2 bug: LoadBalancingDistributedSampler tests ``if not self.sample_complexities``
    on the numpy array it cached, so its second use (``set_epoch`` for the next epoch) raises
    "truth value of an array ... is ambiguous". Give the cached array a plain truth value.
    Can go with ORTModule."""
    import numpy as np

    class _Complexities(np.ndarray):
        def __bool__(self) -> bool:
            return self.size > 0

    if isinstance(sampler.sample_complexities, np.ndarray):
        sampler.sample_complexities = sampler.sample_complexities.view(_Complexities)


def apply_ort_bridges() -> None:
    """Bridges applied to ORT's own modules right after they import."""
    global _ort_done
    with _lock:
        if _ort_done:
            return
        _bridge_cpu_nvtx()
        _bridge_sparsity_switches()
        _bridge_mem_efficient_grad_device()
        _bridge_frozen_parameters()
        _bridge_post_export_repairs()
        _bridge_padding_elimination()
        _bridge_gradient_graph_cache()
        _bridge_session_graph_cache()
        _bridge_shape_inference_non_finite()
        _ort_done = True


# --- transformers' Trainer ----------------------------------------------------------------------
# ORTTrainer computes Trainer.compute_loss's loss in the engine (ModuleWithLoss); what the parent
# does to that loss afterwards is mirrored here, from the transformers the package is capped at.


def loss_as_trainer_returns(trainer, loss, num_items_in_batch):
    """``loss`` (the model's, the label smoother's or ``compute_loss_func``'s) after what
    ``Trainer.compute_loss`` of transformers 5.23-5.24 does to it: when the tokens are averaged
    across devices, ``num_items_in_batch`` is the whole world's count, so each rank's loss is scaled
    by the processes that share it (tensor-parallel ranks see one batch) or by the GPUs of a
    DataParallel. Recheck against the parent when the transformers cap moves: 4.x scaled by
    ``num_processes`` alone, and 5.x reads ``get_tp_size``."""
    if (
        trainer.args.average_tokens_across_devices
        and (trainer.model_accepts_loss_kwargs or trainer.compute_loss_func)
        and num_items_in_batch is not None
    ):
        scale = trainer.accelerator.num_processes // trainer.get_tp_size()
        loss = loss * (scale if trainer.args.n_gpu <= 1 else trainer.args.n_gpu)
    return loss
