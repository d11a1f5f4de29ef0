#include "dlpack_tensor.h"

#include <sstream>

#include "core/check.h"
#include "dlpack.h"

namespace tutti {
namespace py {
namespace {

DType to_dtype(const DLDataType& t, const char* what) {
  TUTTI_ARG_CHECK(t.lanes == 1, what, ": vectorised DLPack dtypes (lanes=",
                  t.lanes, ") are not supported");
  if (t.code == kDLFloat && t.bits == 32) return DType::kFloat32;
  if (t.code == kDLFloat && t.bits == 16) return DType::kFloat16;
  if (t.code == kDLFloat && t.bits == 64) return DType::kFloat64;
  if (t.code == kDLBfloat && t.bits == 16) return DType::kBFloat16;
  if (t.code == kDLInt && t.bits == 8) return DType::kInt8;
  if (t.code == kDLInt && t.bits == 32) return DType::kInt32;
  if (t.code == kDLInt && t.bits == 64) return DType::kInt64;
  if (t.code == kDLUInt && t.bits == 8) return DType::kUInt8;
  TUTTI_THROW(kInvalidArgument, what, " has dtype ",
              describe_dl_dtype(t.code, t.bits, t.lanes),
              ", which tutti does not support (float32, float16, bfloat16, "
              "float64, int8, uint8, int32, int64)");
}

Device to_device(const DLDevice& d, const char* what) {
  switch (d.device_type) {
    case kDLCPU:
    case kDLCUDAHost:  // pinned host memory is host memory
      return Device::cpu();
    case kDLCUDA:
    case kDLCUDAManaged:
      return Device::cuda(d.device_id);
    default:
      TUTTI_THROW(kInvalidArgument, what, " lives on DLPack device type ",
                  d.device_type,
                  "; tutti supports host (CPU) and CUDA tensors");
  }
}

}  // namespace

std::string describe_dl_dtype(uint8_t code, uint8_t bits, uint16_t lanes) {
  std::ostringstream os;
  switch (code) {
    case kDLInt: os << "int"; break;
    case kDLUInt: os << "uint"; break;
    case kDLFloat: os << "float"; break;
    case kDLBfloat: os << "bfloat"; break;
    case kDLComplex: os << "complex"; break;
    case kDLBool: os << "bool"; break;
    default: os << "code" << static_cast<int>(code) << "_"; break;
  }
  os << static_cast<int>(bits);
  if (lanes != 1) os << "x" << lanes;
  return os.str();
}

PyTensor import_tensor(const pyb::handle& obj, const char* what,
                       int64_t stream) {
  TUTTI_ARG_CHECK(pyb::hasattr(obj, "__dlpack__"), what, " of type ",
                  std::string(pyb::str(pyb::type::handle_of(obj).attr("__name__"))),
                  " does not support DLPack (__dlpack__); pass a numpy, "
                  "PyTorch, CuPy or JAX array");
  PyTensor out;
  out.owner = pyb::reinterpret_borrow<pyb::object>(obj);
  // CUDA producers take a stream argument; host producers may not accept it.
  bool cuda = false;
  if (pyb::hasattr(obj, "__dlpack_device__")) {
    pyb::tuple dev = obj.attr("__dlpack_device__")();
    const int type = dev[0].cast<int>();
    cuda = type == kDLCUDA || type == kDLCUDAManaged;
  }
  out.capsule = cuda ? obj.attr("__dlpack__")(pyb::arg("stream") = stream)
                     : obj.attr("__dlpack__")();
  PyObject* cap = out.capsule.ptr();
  TUTTI_ARG_CHECK(PyCapsule_IsValid(cap, "dltensor"), what,
                  ": __dlpack__ did not return an unused 'dltensor' capsule");
  auto* managed =
      static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
  const DLTensor& t = managed->dl_tensor;
  const DType dtype = to_dtype(t.dtype, what);
  const Device device = to_device(t.device, what);
  TUTTI_ARG_CHECK(t.ndim >= 0 && t.ndim <= Shape::kMaxDims, what, " has ",
                  t.ndim, " dimensions; tutti supports at most ",
                  Shape::kMaxDims);
  Shape shape(t.shape, t.ndim);
  // Contiguity: strides NULL, or equal to the compact row-major strides
  // (dimensions of size 1 may carry any stride).
  if (t.strides != nullptr) {
    int64_t expect = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expect) {
        std::ostringstream st;
        for (int j = 0; j < t.ndim; ++j) st << (j ? ", " : "") << t.strides[j];
        TUTTI_THROW(kInvalidArgument, what, " ", dtype_name(dtype),
                    shape.str(), " is not contiguous (strides [", st.str(),
                    "] in elements); make it contiguous first (e.g. "
                    ".contiguous() / np.ascontiguousarray)");
      }
      expect *= t.shape[i];
    }
  }
  char* data = static_cast<char*>(t.data);
  if (data) data += t.byte_offset;
  out.tensor = Tensor(shape.numel() == 0 ? nullptr : data, dtype, shape, device);
  return out;
}

}  // namespace py
}  // namespace tutti
