// An outside project using the installed dtensor: builds a tensor and checks a view.
#include <cstdio>

#include "core/tensor.h"

int main() {
  auto x = dt::Tensor::Arange(0, 6);
  if (!x.ok()) return 1;
  auto m = x->View({2, 3});
  if (!m.ok()) return 1;
  auto col = m->Select(1, 2);
  if (!col.ok() || col->ToDoubles() != std::vector<double>{2, 5}) {
    std::fprintf(stderr, "unexpected column\n");
    return 1;
  }
  std::printf("consumer OK: %s\n", col->ToString().c_str());
  return 0;
}
