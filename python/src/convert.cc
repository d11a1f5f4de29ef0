#include "convert.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>

#include "core/check.h"
#include "tutti/dtype.h"

#if TUTTI_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_utils.h"
#endif

namespace tutti {
namespace py {

DType parse_dtype(const pyb::handle& obj) {
  if (pyb::isinstance<pyb::str>(obj)) return dtype_from_name(obj.cast<std::string>());
  std::string s = pyb::str(obj);
  // torch.float32 prints as "torch.float32"; numpy types go through np.dtype.
  if (s.rfind("torch.", 0) == 0) return dtype_from_name(s.substr(6));
  try {
    pyb::object np_dtype = pyb::module_::import("numpy").attr("dtype")(obj);
    return dtype_from_name(np_dtype.attr("name").cast<std::string>());
  } catch (const pyb::error_already_set&) {
    TUTTI_THROW(kInvalidArgument, "dtype ", s,
                " is not a tutti dtype (float32, float16, bfloat16, float64, "
                "int8, uint8, int32, int64)");
  }
}

Device parse_device(const pyb::handle& obj) {
  if (obj.is_none()) return Device::cpu();
  return Device::parse(pyb::str(obj).cast<std::string>());
}

pyb::dict shard_to_dict(const ShardInfo& s) {
  pyb::dict d;
  d["global_shape"] = pyb::cast(s.global_shape);
  d["dim"] = s.dim;
  d["offset"] = s.offset;
  d["group"] = s.group;
  d["flat"] = s.flat;
  d["per_rank"] = s.per_rank;
  return d;
}

namespace {

const char* numpy_name(DType d) {
  return d == DType::kBFloat16 ? "float32" : dtype_name(d);
}

// Host bytes of `t` (a copy for CUDA tensors, the memory itself on the host).
const void* host_bytes(const Tensor& t, std::vector<char>* staging) {
  if (!t.is_cuda() || t.numel() == 0) return t.data();
#if TUTTI_WITH_CUDA
  staging->resize(t.nbytes());
  // A guard, not a bare cudaSetDevice: the caller's (PyTorch's) current
  // device must be the same afterwards.
  cuda::DeviceGuard guard(t.device().index);
  const cudaError_t e =
      cudaMemcpy(staging->data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost);
  TUTTI_ARG_CHECK(e == cudaSuccess, "copying ", t.str(), " to the host: ",
                  cudaGetErrorString(e));
  return staging->data();
#else
  TUTTI_THROW(kUnsupported, t.str(), ": this build of tutti has no CUDA support");
#endif
}

}  // namespace

pyb::object to_numpy(const Tensor& t) {
  pyb::dtype dt(numpy_name(t.dtype()));
  std::vector<pyb::ssize_t> shape(t.shape().data(), t.shape().data() + t.ndim());
  pyb::array out(dt, shape);
  std::vector<char> staging;
  const void* src = host_bytes(t, &staging);
  if (t.numel() > 0)
    convert(src, t.dtype(), out.mutable_data(),
            t.dtype() == DType::kBFloat16 ? DType::kFloat32 : t.dtype(),
            static_cast<size_t>(t.numel()));
  return std::move(out);
}

void copy_into(const Tensor& src, const Tensor& dst, const std::string& what) {
  TUTTI_ARG_CHECK(src.numel() == dst.numel(), what, ": ", src.numel(),
                  " elements given, ", dst.str(), " expected");
  if (dst.numel() == 0) return;
  std::vector<char> staging;
  const void* host_src = host_bytes(src, &staging);
  if (!dst.is_cuda()) {
    convert(host_src, src.dtype(), dst.data(), dst.dtype(),
            static_cast<size_t>(dst.numel()));
    return;
  }
#if TUTTI_WITH_CUDA
  std::vector<char> converted(dst.nbytes());
  convert(host_src, src.dtype(), converted.data(), dst.dtype(),
          static_cast<size_t>(dst.numel()));
  cuda::DeviceGuard guard(dst.device().index);
  // On the device when this returns (a plain cudaMemcpy from pageable
  // memory may return before the DMA lands).
  try {
    cuda::copy_to_device_sync(dst.data(), converted.data(), dst.nbytes());
  } catch (const Error& err) {
    TUTTI_THROW(kInvalidArgument, what, ": copying to ", dst.str(), ": ", err.message());
  }
#else
  TUTTI_THROW(kUnsupported, what, ": this build of tutti has no CUDA support");
#endif
}

pyb::dict state_to_numpy(const StateDict& state) {
  pyb::dict out;
  for (const auto& nt : state) out[pyb::str(nt.name)] = to_numpy(nt.tensor);
  return out;
}

PyTensor import_array_like(const pyb::handle& obj, const char* what) {
  // A torch tensor that requires grad refuses DLPack; its .detach() shares
  // the memory.
  if (pyb::hasattr(obj, "requires_grad") && obj.attr("requires_grad").cast<bool>())
    return import_tensor(obj.attr("detach")(), what);
  if (pyb::hasattr(obj, "__dlpack__")) return import_tensor(obj, what);
  pyb::object arr = pyb::module_::import("numpy").attr("ascontiguousarray")(obj);
  return import_tensor(arr, what);
}

void load_state(const StateDict& state, const pyb::handle& values, bool strict,
                const std::string& what) {
  TUTTI_ARG_CHECK(pyb::hasattr(values, "keys"), what,
                  ".load_state_dict: expected a mapping name -> array");
  const auto mapping = pyb::reinterpret_borrow<pyb::object>(values);
  if (strict) {
    for (const auto& key : mapping.attr("keys")()) {
      const std::string k = pyb::str(key);
      bool known = false;
      for (const auto& nt : state) known = known || nt.name == k;
      TUTTI_ARG_CHECK(known, what, ".load_state_dict: unexpected key '", k,
                      "' (strict=True)");
    }
  }
  // Check everything first so a bad entry leaves the state untouched.
  std::vector<std::pair<const NamedTensor*, PyTensor>> todo;
  for (const auto& nt : state) {
    if (!mapping.attr("__contains__")(nt.name).cast<bool>()) {
      TUTTI_ARG_CHECK(!strict, what, ".load_state_dict: missing key '",
                      nt.name, "' (strict=True)");
      continue;
    }
    const std::string label = what + " '" + nt.name + "'";
    PyTensor v = import_array_like(mapping[pyb::str(nt.name)], label.c_str());
    const bool scalar_like = v.tensor.numel() == 1 && nt.tensor.numel() == 1;
    TUTTI_ARG_CHECK(scalar_like || v.tensor.shape() == nt.tensor.shape(),
                    label, ": shape ", v.tensor.shape().str(), " given, ",
                    nt.tensor.shape().str(), " expected");
    todo.emplace_back(&nt, std::move(v));
  }
  pyb::gil_scoped_release nogil;
  for (auto& [nt, v] : todo) copy_into(v.tensor, nt->tensor, what + " '" + nt->name + "'");
}

pyb::dict state_views(const StateDict& state, std::shared_ptr<const void> owner) {
  pyb::dict out;
  for (const auto& nt : state)
    out[pyb::str(nt.name)] = pyb::cast(TensorView{nt.tensor, owner});
  return out;
}

StateDict state_from_mapping(const pyb::handle& mapping,
                             std::vector<PyTensor>* keep, const char* what) {
  TUTTI_ARG_CHECK(pyb::isinstance<pyb::dict>(mapping), what,
                  " must be a dict name -> tensor");
  StateDict out;
  for (const auto& item : pyb::reinterpret_borrow<pyb::dict>(mapping)) {
    NamedTensor nt;
    nt.name = pyb::str(item.first);
    const std::string label = std::string(what) + " '" + nt.name + "'";
    keep->push_back(import_tensor(item.second, label.c_str()));
    nt.tensor = keep->back().tensor;
    out.push_back(std::move(nt));
  }
  return out;
}

}  // namespace py
}  // namespace tutti
