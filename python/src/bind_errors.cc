// tutti::Error -> Python exceptions with the same message and code.
//
//   tutti.Error (RuntimeError)              every tutti failure; .code is the name
//   ├── tutti.InvalidArgumentError (also ValueError)
//   ├── tutti.MismatchError
//   ├── tutti.TimeoutError (also the builtin TimeoutError)
//   ├── tutti.CommError          (kCommFailure, kMpi, kNccl)
//   ├── tutti.CheckpointError    (kIo, kCorrupt, kNotFound)
//   ├── tutti.UnsupportedError
//   ├── tutti.AbortedError
//   └── tutti.RanksLostError (also tutti.CommError) kRanksLost: tutti.recover()
#include <map>

#include "bindings.h"
#include "tutti/error.h"

namespace tutti {
namespace py {
namespace {

namespace pyb = pybind11;

PyObject* make_exception(pyb::module_& m, const char* name, PyObject* bases,
                         const char* doc) {
  const std::string qual = std::string("tutti.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qual.c_str(), doc, bases, nullptr);
  if (!cls) throw pyb::error_already_set();
  m.add_object(name, pyb::handle(cls));
  return cls;
}

std::map<ErrorCode, PyObject*>& classes() {
  static std::map<ErrorCode, PyObject*> c;
  return c;
}
PyObject* g_base = nullptr;

}  // namespace

void bind_errors(pyb::module_& m) {
  g_base = make_exception(m, "Error", PyExc_RuntimeError,
                          "Base of every tutti error; `code` names the kind.");
  auto sub = [&](const char* name, PyObject* extra, const char* doc) {
    PyObject* bases = extra ? PyTuple_Pack(2, g_base, extra) : PyTuple_Pack(1, g_base);
    PyObject* cls = make_exception(m, name, bases, doc);
    Py_DECREF(bases);
    return cls;
  };
  PyObject* invalid = sub("InvalidArgumentError", PyExc_ValueError,
                          "The caller passed something wrong; nothing ran.");
  PyObject* mismatch = sub("MismatchError", nullptr,
                           "Ranks disagree about a collective or a plan.");
  PyObject* timeout = sub("TimeoutError", PyExc_TimeoutError,
                          "An operation exceeded TUTTI_TIMEOUT; the message "
                          "names the ranks that never arrived.");
  PyObject* comm = sub("CommError", nullptr, "A transport (MPI/NCCL) failed.");
  PyObject* ckpt = sub("CheckpointError", nullptr,
                       "Checkpoint I/O failed or a file is corrupt/missing.");
  PyObject* unsupported = sub("UnsupportedError", nullptr,
                              "Not available in this build or on this machine.");
  PyObject* aborted = sub("AbortedError", nullptr,
                          "The object failed earlier and is unusable.");
  // A CommError too: code that ends the process on a CommError keeps doing
  // so; code that recovers in-process (tutti.recover()) catches this first.
  PyObject* lost_bases = PyTuple_Pack(1, comm);
  PyObject* lost = make_exception(
      m, "RanksLostError", lost_bases,
      "Peers died (Open MPI with ULFM); the message names them.  The survivors "
      "can call tutti.recover() and go on at the smaller size.");
  Py_DECREF(lost_bases);
  auto& c = classes();
  c[ErrorCode::kInvalidArgument] = invalid;
  c[ErrorCode::kMismatch] = mismatch;
  c[ErrorCode::kTimeout] = timeout;
  c[ErrorCode::kCommFailure] = comm;
  c[ErrorCode::kMpi] = comm;
  c[ErrorCode::kNccl] = comm;
  c[ErrorCode::kIo] = ckpt;
  c[ErrorCode::kCorrupt] = ckpt;
  c[ErrorCode::kNotFound] = ckpt;
  c[ErrorCode::kUnsupported] = unsupported;
  c[ErrorCode::kAborted] = aborted;
  c[ErrorCode::kRanksLost] = lost;

  pyb::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      auto it = classes().find(e.code());
      PyObject* cls = it != classes().end() ? it->second : g_base;
      // Raise cls(message) and attach .code for programmatic handling.
      pyb::object exc = pyb::reinterpret_steal<pyb::object>(
          PyObject_CallFunction(cls, "s", e.what()));
      if (!exc) return;  // the call already set a Python error
      PyObject_SetAttrString(exc.ptr(), "code",
                             pyb::str(error_code_name(e.code())).ptr());
      PyErr_SetObject(cls, exc.ptr());
    }
  });
}

}  // namespace py
}  // namespace tutti
