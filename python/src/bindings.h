// One registration function per area (bind_<area>.cc), called from module.cc.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "tutti/optim.h"

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
void bind_zero(pybind11::module_& m);
void bind_tp(pybind11::module_& m);
// Empty when the layer is not in this tree (checked with __has_include).
void bind_checkpoint(pybind11::module_& m);
void bind_preemption(pybind11::module_& m);

// 'sgd', 'adam', 'adamw' -> optim::Kind (kInvalidArgument otherwise).
optim::Kind parse_optim_kind(const std::string& kind);
// The hyper-parameters of tutti.optim.step and tutti.ShardedOptimizer
// (torch.optim's names; step left at 1).
optim::Hyper make_hyper(const std::string& kind, float lr, float momentum, float dampening,
                        bool nesterov, float beta1, float beta2, float eps,
                        float weight_decay, bool maximize);

}  // namespace py
}  // namespace tutti
