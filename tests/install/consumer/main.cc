// Uses only the installed public headers: all-reduce of rank+1 over the
// world must give n(n+1)/2 on every rank.
#include <tutti/tutti.h>

#include <cstdio>

int main() {
  tutti::init();
  auto world = tutti::world();
  const int n = world->size();
  double v = world->rank() + 1;
  world->allreduce(tutti::Tensor::of(&v, 1), tutti::ReduceOp::kSum);
  const bool ok = v == n * (n + 1) / 2.0;
  std::printf("consumer rank %d/%d: sum %g %s\n", world->rank(), n, v, ok ? "OK" : "WRONG");
  tutti::shutdown();
  return ok ? 0 : 1;
}
