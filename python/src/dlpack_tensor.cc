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
  // `stream` is a CUDA stream handle, where 0 is the legacy default stream;
  // the DLPack protocol spells that stream 1 and disallows 0 (PyTorch 2.11
  // raises on it).  -1 (no synchronisation), 1, 2 and real handles pass.
  const int64_t dl_stream = stream == 0 ? 1 : stream;
  out.capsule = cuda ? obj.attr("__dlpack__")(pyb::arg("stream") = dl_stream)
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

std::vector<PyTensor> import_tensors(const pyb::handle& seq, const char* what,
                                     int64_t stream) {
  TUTTI_ARG_CHECK(pyb::isinstance<pyb::sequence>(seq) &&
                      !pyb::hasattr(seq, "__dlpack__"),
                  what, " must be a list or tuple of tensors");
  std::vector<PyTensor> out;
  const auto items = pyb::reinterpret_borrow<pyb::sequence>(seq);
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string name = std::string(what) + "[" + std::to_string(i) + "]";
    out.push_back(import_tensor(items[i], name.c_str(), stream));
  }
  return out;
}

std::vector<Tensor> views(const std::vector<PyTensor>& ts) {
  std::vector<Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(t.tensor);
  return out;
}

namespace {

DLDataType to_dl_dtype(DType d) {
  switch (d) {
    case DType::kFloat32: return {kDLFloat, 32, 1};
    case DType::kFloat16: return {kDLFloat, 16, 1};
    case DType::kBFloat16: return {kDLBfloat, 16, 1};
    case DType::kFloat64: return {kDLFloat, 64, 1};
    case DType::kInt8: return {kDLInt, 8, 1};
    case DType::kUInt8: return {kDLUInt, 8, 1};
    case DType::kInt32: return {kDLInt, 32, 1};
    case DType::kInt64: return {kDLInt, 64, 1};
  }
  TUTTI_THROW(kInternal, "unknown dtype ", static_cast<int>(d));
}

// The DLManagedTensor and what it points into, freed together.
struct Exported {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  std::shared_ptr<const void> owner;
};

void delete_exported(DLManagedTensor* self) {
  delete static_cast<Exported*>(self->manager_ctx);
}

// A capsule still named "dltensor" was never consumed: free it here.
void capsule_destructor(PyObject* cap) {
  if (!PyCapsule_IsValid(cap, "dltensor")) return;  // consumed (renamed)
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
  if (m && m->deleter) m->deleter(m);
}

}  // namespace

pyb::capsule export_tensor(const Tensor& t, std::shared_ptr<const void> owner) {
  auto* e = new Exported;
  e->shape = t.shape().vec();
  e->owner = std::move(owner);
  DLTensor& d = e->managed.dl_tensor;
  d.data = t.data();
  d.device = t.is_cuda() ? DLDevice{kDLCUDA, t.device().index} : DLDevice{kDLCPU, 0};
  d.ndim = t.ndim();
  d.dtype = to_dl_dtype(t.dtype());
  d.shape = e->shape.empty() ? nullptr : e->shape.data();
  d.strides = nullptr;  // compact row-major
  d.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = delete_exported;
  PyObject* cap = PyCapsule_New(&e->managed, "dltensor", capsule_destructor);
  if (!cap) {
    delete e;
    throw pyb::error_already_set();
  }
  return pyb::reinterpret_steal<pyb::capsule>(cap);
}

}  // namespace py
}  // namespace tutti
