// A short tour of gradwire's tensors: creation, broadcasting, views that share storage,
// reductions, matrix products, random numbers and safetensors round trips. `./gw demo` runs
// it until the training examples take over.
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "core/ops.h"

int main() {
  std::cout << "== creation and broadcasting\n";
  gw::Tensor a = gw::tensor({{1.f, 2.f}, {3.f, 4.f}});
  gw::Tensor b = gw::ones({2});
  gw::Tensor c = gw::matmul(a, a.t()) + b * 2;
  std::cout << "a @ a.T + 2 =\n" << c << "\n";
  std::cout << "sum = " << c.sum().item<float>() << ", mean over rows = " << c.mean({0}) << "\n";

  std::cout << "\n== views share storage\n";
  gw::Tensor x = gw::arange(12, gw::kFloat32).reshape({3, 4});
  gw::Tensor col = x.select(1, 2);  // a strided view of column 2
  col.mul_(10);
  std::cout << "x after scaling column 2 through a view:\n" << x << "\n";
  std::cout << "x.t() is a view: " << std::boolalpha << (x.t().storage() == x.storage())
            << ", contiguous: " << x.t().is_contiguous() << "\n";

  std::cout << "\n== dtype promotion, like PyTorch\n";
  gw::Tensor i = gw::arange(4);
  std::cout << i.dtype() << " * 2 -> " << (i * 2).dtype() << "; " << i.dtype() << " * 2.5 -> "
            << (i * 2.5).dtype() << "; " << i.dtype() << " / 2 -> " << (i / 2).dtype() << "\n";

  std::cout << "\n== reductions and softmax\n";
  gw::Generator gen(0);
  gw::Tensor logits = gw::randn({2, 5}, gen);
  std::cout << "logits:\n" << logits << "\nsoftmax(dim=1):\n" << gw::softmax(logits, 1)
            << "\nargmax(dim=1): " << gw::argmax(logits, 1) << "\n";

  std::cout << "\n== safetensors round trip\n";
  auto path = std::filesystem::temp_directory_path() / "gradwire_tour.safetensors";
  gw::save_safetensors(path.string(), {{"logits", logits}, {"x", x}});
  auto loaded = gw::load_safetensors(path.string());
  std::cout << "loaded " << loaded.size() << " tensors; logits equal: "
            << gw::equal(loaded.at("logits"), logits) << "\n";
  std::filesystem::remove(path);

  std::cout << "\n== errors name the op and the values\n";
  try {
    gw::matmul(gw::zeros({2, 3}), gw::zeros({4, 5}));
  } catch (const gw::ShapeError& e) {
    std::cout << "ShapeError: " << e.what() << "\n";
  }
  return 0;
}
