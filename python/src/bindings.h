// One registration function per area (bind_<area>.cc), called from module.cc.
#pragma once

#include <pybind11/pybind11.h>

namespace tutti {
namespace py {

void bind_errors(pybind11::module_& m);
void bind_core(pybind11::module_& m);
void bind_comm(pybind11::module_& m);

}  // namespace py
}  // namespace tutti
