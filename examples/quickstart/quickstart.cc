// The smallest tutti program: every rank contributes a vector, all-reduces
// it (average), and checks the closed-form result.
//
//   mpirun -np 4 build/examples/quickstart/quickstart
#include <tutti/tutti.h>

#include <cstdio>
#include <vector>

int main() {
  tutti::init();
  auto world = tutti::world();
  const int rank = world->rank(), n = world->size();
  std::vector<float> grad(1 << 20);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(rank + i % 10);
  world->allreduce(tutti::Tensor::of(grad), tutti::ReduceOp::kAvg, {"grad"});
  // avg over ranks of (rank + i % 10) = (n - 1) / 2 + i % 10
  size_t wrong = 0;
  for (size_t i = 0; i < grad.size(); ++i)
    if (grad[i] != (n - 1) / 2.0f + static_cast<float>(i % 10)) ++wrong;
  std::printf("[rank %d/%d, local %d/%d] averaged %zu floats: %s\n", rank, n,
              tutti::local_rank(), tutti::local_size(), grad.size(),
              wrong ? "WRONG" : "ok");
  tutti::shutdown();
  return wrong ? 1 : 0;
}
