// Python objects -> tutti::Tensor views, zero-copy, through DLPack.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "tutti/tensor.h"

namespace tutti {
namespace py {

namespace pyb = pybind11;

// A borrowed view of a Python tensor.  Holds the DLPack capsule (and so the
// producer's buffer) alive for as long as the view is in use; the capsule's
// own destructor releases it afterwards.
struct PyTensor {
  Tensor tensor;
  pyb::object capsule;  // keeps the exported buffer alive
  pyb::object owner;    // the original Python object
};

// Imports `obj` (anything with __dlpack__, e.g. numpy.ndarray, torch.Tensor,
// cupy.ndarray, jax.Array) as a contiguous tensor.  `what` names the argument
// in errors ("tensor", "output").  Non-contiguous, lane-vectorised, complex
// or bool tensors, and unsupported devices, are Error(kInvalidArgument) with
// the offending property named.  `stream` is passed to __dlpack__ for CUDA
// producers (-1: no synchronisation requested, the caller orders streams).
PyTensor import_tensor(const pyb::handle& obj, const char* what,
                       int64_t stream = -1);

// The tutti dtype name of a DLPack type, for messages.
std::string describe_dl_dtype(uint8_t code, uint8_t bits, uint16_t lanes);

}  // namespace py
}  // namespace tutti
