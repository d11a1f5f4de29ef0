// Hyper-parameter sets the optim tests sweep: every kind and both branches
// (SGD with dampening, Nesterov + maximize; Adam with L2 decay; AdamW with
// beta1 < 0.5, ATen's other lerp branch, and maximize).
#pragma once

#include <vector>

#include "tutti/optim.h"

namespace tutti {
namespace optim {
namespace test {

inline std::vector<Hyper> hyper_grid() {
  std::vector<Hyper> out;
  Hyper s;
  s.kind = Kind::kSgd;
  s.lr = 0.05f;
  s.momentum = 0.9f;
  s.dampening = 0.1f;
  s.weight_decay = 1e-3f;
  out.push_back(s);
  s.dampening = 0;
  s.nesterov = true;
  s.maximize = true;
  out.push_back(s);
  Hyper a;
  a.weight_decay = 0.01f;
  out.push_back(a);
  a.kind = Kind::kAdamW;
  a.beta1 = 0.3f;
  a.maximize = true;
  out.push_back(a);
  return out;
}

}  // namespace test
}  // namespace optim
}  // namespace tutti
