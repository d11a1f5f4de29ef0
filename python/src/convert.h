// Conversions the binding areas share: dtype/device/stream arguments, views
// of C++-owned memory handed to Python (TensorView), and state dicts as
// numpy copies.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "dlpack_tensor.h"
#include "tutti/state.h"
#include "tutti/tensor.h"

namespace tutti {
namespace py {

namespace pyb = pybind11;

// A tensor tutti owns (a layer's weight, a loss scaler's scale), seen from
// Python.  Exports itself through DLPack, zero-copy: torch.from_dlpack(v),
// numpy.from_dlpack(v).  `owner` keeps the memory alive for as long as the
// view or anything imported from it lives.
struct TensorView {
  Tensor tensor;
  std::shared_ptr<const void> owner;
};

// "float32", numpy dtypes (np.float16, np.dtype('int8')) and torch dtypes
// (torch.bfloat16) -> DType.  kInvalidArgument for anything else.
DType parse_dtype(const pyb::handle& obj);
// "cpu", "cuda", "cuda:1", or a torch.device -> Device.
Device parse_device(const pyb::handle& obj);
// A cudaStream_t passed from Python as an integer (0: legacy default).
inline void* as_stream(int64_t s) {
  return reinterpret_cast<void*>(static_cast<intptr_t>(s));
}

// ShardInfo as {"global_shape", "dim", "offset", "group", "flat"}.
pyb::dict shard_to_dict(const ShardInfo& s);

// A copy of `t` as a numpy array (bfloat16 becomes float32, exactly; CUDA
// tensors are copied to the host).
pyb::object to_numpy(const Tensor& t);
// Copies `src` into `dst` converting the dtype (tutti::convert rules); host
// or CUDA on either side.  Element counts must match.
void copy_into(const Tensor& src, const Tensor& dst, const std::string& what);

// state_dict(): name -> numpy copy.
pyb::dict state_to_numpy(const StateDict& state);
// Writes `values` (a mapping name -> array-like: numpy, torch, lists,
// scalars) into the tensors of `state`.  strict: every name must be present
// and no other; otherwise missing names are left alone.  `what` names the
// component in errors.
void load_state(const StateDict& state, const pyb::handle& values, bool strict,
                const std::string& what);
// name -> TensorView (zero-copy) for a state dict of a C++ object.
pyb::dict state_views(const StateDict& state, std::shared_ptr<const void> owner);

// A mapping name -> tensor (any DLPack object) as a StateDict of views;
// `keep` holds the imports alive while the views are used.
StateDict state_from_mapping(const pyb::handle& mapping,
                             std::vector<PyTensor>* keep, const char* what);

// Imports `obj` through DLPack, or through numpy.asarray when it has no
// __dlpack__ (lists, scalars).
PyTensor import_array_like(const pyb::handle& obj, const char* what);

}  // namespace py
}  // namespace tutti
