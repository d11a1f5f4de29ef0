// One registration function per area (bind_<area>.cc), called from module.cc.
#pragma once

#include <pybind11/pybind11.h>

namespace tutti {
namespace py {

void bind_errors(pybind11::module_& m);
void bind_core(pybind11::module_& m);
void bind_comm(pybind11::module_& m);
void bind_state(pybind11::module_& m);
void bind_compression(pybind11::module_& m);
void bind_dp(pybind11::module_& m);
void bind_amp(pybind11::module_& m);
void bind_optim(pybind11::module_& m);
void bind_tp(pybind11::module_& m);
// Empty when the layer is not in this tree (checked with __has_include).
void bind_checkpoint(pybind11::module_& m);
void bind_preemption(pybind11::module_& m);

}  // namespace py
}  // namespace tutti
