// tutti._C: the compiled half of the `tutti` package.
#include <pybind11/pybind11.h>

#include <string>

#include "bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "tutti's compiled core (use the `tutti` package instead)";
  tutti::py::bind_errors(m);
  tutti::py::bind_core(m);
  tutti::py::bind_comm(m);
  // Stateful first: the areas below derive from it.
  tutti::py::bind_state(m);
  tutti::py::bind_compression(m);
  tutti::py::bind_dp(m);
  tutti::py::bind_amp(m);
  tutti::py::bind_optim(m);
  tutti::py::bind_zero(m);  // after Reducer and Stateful
  tutti::py::bind_tp(m);
  tutti::py::bind_checkpoint(m);
  tutti::py::bind_preemption(m);
  // Submodules become importable (`from tutti._C.amp import ...`).
  auto modules = pybind11::module_::import("sys").attr("modules");
  for (const char* sub : {"amp", "optim", "tensor_parallel"})
    modules[(std::string("tutti._C.") + sub).c_str()] = m.attr(sub);
}
