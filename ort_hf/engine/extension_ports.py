"""Ports of ORT 1.19.2's torch C++ extensions to current torch (2.13).

``apply_port`` edits a *copy* of an extension's sources (made by ``extensions._prepare_sources``)
with exact text replacements (``PORTS``); if any expected text is missing the build stops with
``ExtensionBuildError`` instead of compiling something half-ported.

torch_interop_utils
-------------------

``torch_interop_utils`` is what lets ORTModule run custom ``torch.autograd.Function``s as
PythonOp / PythonOpGrad (ORT's label-sparsity detector is itself such a PythonOp). Its
sources were written against torch ~2.1 and no longer compile.

What moved in torch (checked against the torch 2.13 headers and libtorch_python.so exports):

* Autograd node pointers (``Tensor::grad_fn()``, ``AutogradMeta::grad_fn_``, ``Edge::function``,
  ``try_get_grad_accumulator``, ``SavedVariable::unpack``) are ``c10::intrusive_ptr<Node>``,
  no longer ``std::shared_ptr<Node>``.
* ``PyNode::obj`` is gone: the node reaches its ``THPFunction`` via ``PyNode::pyobj()``
  (its pyobj_slot), and ``THPFunction::cdata`` is an owning ``intrusive_ptr<Node>``
  instead of a ``weak_ptr`` (so no ``.lock()``).
* The type info of ``torch::autograd::PyNode`` is not exported from libtorch_python, so a
  ``dynamic_cast<PyNode*>`` compiles but the module fails to load (undefined symbol
  ``typeinfo for torch::autograd::PyNode``). ``functionToPyObject(grad_fn)`` (exported) returns
  the THPFunction for a PyNode, which ``THPFunction_Check`` recognises.
* ``torch::utils::tensor_fromDLPack`` is declared in tensor_new.h but not exported any more;
  a local equivalent built on ``at::fromDLPack`` (exported from libtorch_cpu) replaces it.

One fix beyond torch's moves, in the code we replace anyway: ORT detected ``ctx.mark_dirty``
inputs by reading ``THPFunction::dirty_tensors``, which torch clears inside ``apply()``
(``_mark_dirty``), so the detection always said "not dirty" and an in-place Function failed
from its second step ("a leaf Variable that requires grad has been used in an in-place
operation"). A dirty input's history is rebased onto the Function's node; we compare that.

torch_gpu_allocator
-------------------
It hands ORT's CUDA provider the addresses of torch's caching-allocator functions, which ORT
stores and calls through its own function-pointer types (``gpu_external_alloc`` /
``gpu_external_free`` / ``gpu_external_empty_cache`` provider options). The empty-cache address
is ``&c10::cuda::CUDACachingAllocator::emptyCache``, which torch 2.13 declares as
``void emptyCache(MempoolId_t mempool_id = {0, 0})`` while ORT calls it as ``void()``: a call
through the wrong type (the pool id would be whatever the registers hold). A wrapper with ORT's
signature calls it with the default pool instead. alloc and free keep ORT's own ``delegate_*``
wrappers, whose types are the ones ORT calls.
"""

from __future__ import annotations

import pathlib
from typing import NamedTuple

from .errors import ExtensionBuildError


class Replacement(NamedTuple):
    file: str
    old: str
    new: str
    why: str


# Local replacement for torch::utils::tensor_fromDLPack (same behaviour for the "dltensor"
# capsules ORT passes): the tensor takes ownership of the DLManagedTensor, and the capsule is
# renamed so its destructor (ORT's or ours) does not free it a second time.
_FROM_DLPACK_DECL = """
void dlpack_capsule_destructor(PyObject* data);

// ort_hf port: torch::utils::tensor_fromDLPack is no longer exported by libtorch_python.
at::Tensor ort_hf_tensor_from_dlpack(PyObject* capsule);
"""

_FROM_DLPACK_DEF = """
// ort_hf port: equivalent of torch::utils::tensor_fromDLPack (no longer exported) for "dltensor" capsules.
at::Tensor ort_hf_tensor_from_dlpack(PyObject* capsule) {
  auto* dl_managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  TORCH_CHECK(dl_managed != nullptr, "Invalid DLPack capsule: it may have been consumed already.");
  at::Tensor tensor = at::fromDLPack(dl_managed);  // tensor's storage now owns dl_managed
  PyCapsule_SetName(capsule, "used_dltensor");     // never consume (or free) this capsule again
  auto device = tensor.device();
  torch::utils::maybe_initialize_device(device);   // lazy CUDA/XPU init, as torch does
  return tensor;
}
"""

INTEROP_REPLACEMENTS: tuple[Replacement, ...] = (
    Replacement(
        "ctx_pool.h",
        "std::unordered_map<size_t, std::shared_ptr<torch::autograd::Node>> grad_fns_;",
        "std::unordered_map<size_t, c10::intrusive_ptr<torch::autograd::Node>> grad_fns_;",
        "AutogradMeta::grad_fn_ (moved into this pool) is c10::intrusive_ptr<Node>",
    ),
    Replacement(
        "custom_function_shared.h",
        "\nvoid dlpack_capsule_destructor(PyObject* data);\n",
        _FROM_DLPACK_DECL,
        "declare the local DLPack import used by the forward and backward runners",
    ),
    Replacement(
        "custom_function_shared.cc",
        "#include <ATen/DLConvertor.h>\n#include <torch/extension.h>\n",
        "#include <ATen/DLConvertor.h>\n#include <torch/extension.h>\n"
        "#include <torch/csrc/utils/device_lazy_init.h>\n" + _FROM_DLPACK_DEF,
        "define the local DLPack import (at::fromDLPack is exported from libtorch_cpu)",
    ),
    Replacement(
        "custom_function_fw.cc",
        """  const auto& grad_fn = autograd_meta->grad_fn_;
  auto py_node_fn = dynamic_cast<torch::autograd::PyNode*>(grad_fn.get());
  TORCH_CHECK(py_node_fn != nullptr, "grad_fn is not PyNode type.");
  THPFunction* py_fn = (THPFunction*)py_node_fn->obj;
  std::vector<bool> are_tensors_marked_dirty(tensors_to_check.size(), false);
  if (!py_fn->dirty_tensors)
    return are_tensors_marked_dirty;

  Py_ssize_t num_dirty = PyTuple_GET_SIZE(py_fn->dirty_tensors);
  for (const auto j : c10::irange(tensors_to_check.size())) {
    bool is_tensor_marked_dirty = false;
    for (const auto i : c10::irange(num_dirty)) {
      PyObject* obj = PyTuple_GET_ITEM(py_fn->dirty_tensors, i);
      const auto& tensor = THPVariable_Unpack(obj);
      if (tensor.is_same(tensors_to_check[j])) {
        is_tensor_marked_dirty = true;
        break;
      }
    }

    are_tensors_marked_dirty[j] = is_tensor_marked_dirty;
  }
""",
        """  const auto& grad_fn = autograd_meta->grad_fn_;
  // ort_hf port: PyNode's type info is not exported (no dynamic_cast) and PyNode::obj is gone.
  // Reading THPFunction::dirty_tensors never worked either: torch's _mark_dirty() clears it
  // during apply(). An input marked dirty has its history rebased onto this node, so compare.
  std::vector<bool> are_tensors_marked_dirty(tensors_to_check.size(), false);
  for (const auto j : c10::irange(tensors_to_check.size())) {
    are_tensors_marked_dirty[j] = tensors_to_check[j].grad_fn().get() == grad_fn.get();
  }
""",
        "mark_dirty detection without PyNode; dirty_tensors is always cleared by torch",
    ),
    Replacement(
        "custom_function_fw.cc",
        """  const std::shared_ptr<torch::autograd::Node>& cdata = tensor_owning_ctx.value().grad_fn();
  auto py_node_fn = dynamic_cast<torch::autograd::PyNode*>(cdata.get());
  TORCH_CHECK(py_node_fn != nullptr, "cdata is not PyNode type.");

  // ret is THPFunction
  THPFunction* py_fn = (THPFunction*)py_node_fn->obj;
  py::object ret = py::reinterpret_steal<py::object>(torch::autograd::functionToPyObject(cdata));

  TORCH_CHECK(py_fn != nullptr, "cdata is not THPFunction type.");
""",
        """  // ort_hf port: grad_fn() is an intrusive_ptr now; PyNode's type info is not exported
  // (no dynamic_cast) and PyNode::obj is gone, so go through functionToPyObject.
  const c10::intrusive_ptr<torch::autograd::Node>& cdata = tensor_owning_ctx.value().grad_fn();

  // ret is THPFunction
  py::object ret = py::reinterpret_steal<py::object>(torch::autograd::functionToPyObject(cdata));
  TORCH_CHECK(ret && THPFunction_Check(ret.ptr()), "cdata is not THPFunction type.");
  THPFunction* py_fn = (THPFunction*)ret.ptr();
""",
        "ctx lookup: intrusive_ptr grad_fn, THPFunction via functionToPyObject + THPFunction_Check",
    ),
    Replacement(
        "custom_function_fw.cc",
        "  auto saved_for = py_fn->cdata.lock();\n",
        "  auto saved_for = py_fn->cdata;  // ort_hf port: cdata is an owning intrusive_ptr, not a weak_ptr\n",
        "THPFunction::cdata is an owning intrusive_ptr<Node> (was weak_ptr)",
    ),
    Replacement(
        "custom_function_fw.cc",
        "      at::Tensor tensor = torch::utils::tensor_fromDLPack(args[arg_index]);\n",
        "      at::Tensor tensor = ort_hf_tensor_from_dlpack(args[arg_index]);  // ort_hf port\n",
        "torch::utils::tensor_fromDLPack is not exported any more",
    ),
    Replacement(
        "custom_function_bw.cc",
        "        tensor = torch::utils::tensor_fromDLPack(args[arg_index]);\n",
        "        tensor = ort_hf_tensor_from_dlpack(args[arg_index]);  // ort_hf port\n",
        "torch::utils::tensor_fromDLPack is not exported any more",
    ),
)


ALLOCATOR_REPLACEMENTS: tuple[Replacement, ...] = (
    Replacement(
        "torch_gpu_allocator.cc",
        """size_t gpu_caching_allocator_empty_cache_address() {
  // This is useful only if PYTORCH_NO_CUDA_MEMORY_CACHING=1 is not set.
  return reinterpret_cast<size_t>(&c10::cuda::CUDACachingAllocator::emptyCache);
}
""",
        """// ort_hf port: ORT calls this address as void(); torch's emptyCache takes a MempoolId_t.
void delegate_empty_cache() {
  c10::cuda::CUDACachingAllocator::emptyCache();
}

size_t gpu_caching_allocator_empty_cache_address() {
  // This is useful only if PYTORCH_NO_CUDA_MEMORY_CACHING=1 is not set.
  return reinterpret_cast<size_t>(&delegate_empty_cache);
}
""",
        "emptyCache(MempoolId_t) called by ORT as void(): hand ORT a wrapper of that type",
    ),
)

PORTS: dict[str, tuple[Replacement, ...]] = {
    "torch_interop_utils": INTEROP_REPLACEMENTS,
    "torch_gpu_allocator": ALLOCATOR_REPLACEMENTS,
}


def apply_port(name: str, src_dir: pathlib.Path) -> None:
    """Apply ``PORTS[name]`` in place to the copied sources of extension ``name`` in ``src_dir``
    (nothing for an extension that needs no port).

    Every ``old`` text must occur exactly once; otherwise nothing further is built and
    ``ExtensionBuildError`` names the torch version and the file.
    """
    import torch

    src_dir = pathlib.Path(src_dir)
    texts: dict[str, str] = {}
    for rep in PORTS.get(name, ()):
        path = src_dir / rep.file
        if rep.file not in texts:
            if not path.is_file():
                raise ExtensionBuildError(
                    f"Porting {name} to torch {torch.__version__}: {path} is missing "
                    "(the ORT sources changed); update ort_hf/engine/extension_ports.py."
                )
            texts[rep.file] = path.read_text()
        count = texts[rep.file].count(rep.old)
        if count != 1:
            raise ExtensionBuildError(
                f"Porting {name} to torch {torch.__version__}: expected text "
                f"({rep.why}) found {count} times instead of once in {path}; the ORT sources "
                "changed, update ort_hf/engine/extension_ports.py."
            )
        texts[rep.file] = texts[rep.file].replace(rep.old, rep.new)
    for name, text in texts.items():
        (src_dir / name).write_text(text)
