// Python objects -> tutti::Tensor views, zero-copy, through DLPack.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

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
// the offending property named.  `stream` (a CUDA stream handle; 0 is the
// legacy default stream, passed as DLPack's 1) is passed to __dlpack__ for
// CUDA producers (-1: no synchronisation requested, the caller orders
// streams).
PyTensor import_tensor(const pyb::handle& obj, const char* what,
                       int64_t stream = -1);

// Imports every element of a Python sequence of tensors (for multi-tensor
// operations); `what` names the list in errors ("grads[3]").
std::vector<PyTensor> import_tensors(const pyb::handle& seq, const char* what,
                                     int64_t stream = -1);
// The Tensor views of imported tensors.
std::vector<Tensor> views(const std::vector<PyTensor>& ts);

// Exports a tutti view as an unconsumed "dltensor" capsule.  `owner` keeps
// the memory alive until the consumer releases the capsule (a C++ object:
// the deleter may run on any thread, without the GIL).
pyb::capsule export_tensor(const Tensor& t, std::shared_ptr<const void> owner);

// The tutti dtype name of a DLPack type, for messages.
std::string describe_dl_dtype(uint8_t code, uint8_t bits, uint16_t lanes);

}  // namespace py
}  // namespace tutti
