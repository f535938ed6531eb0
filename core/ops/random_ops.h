// Random tensors. Each op has a form taking a Generator and one using the default generator.
#pragma once

#include "core/random.h"
#include "core/tensor.h"

namespace gw {

Tensor rand(Shape shape, Generator& gen, TensorOptions options = {});   // U[0, 1)
Tensor randn(Shape shape, Generator& gen, TensorOptions options = {});  // N(0, 1)
Tensor randint(int64_t low, int64_t high, Shape shape, Generator& gen,
               TensorOptions options = kInt64);                         // [low, high)
Tensor rand(Shape shape, TensorOptions options = {});
Tensor randn(Shape shape, TensorOptions options = {});
Tensor randint(int64_t low, int64_t high, Shape shape, TensorOptions options = kInt64);
// A random permutation of 0..n-1 (int64).
Tensor randperm(int64_t n, Generator& gen);

// Fills in place.
Tensor& uniform_(Tensor& t, double from, double to, Generator& gen);
Tensor& normal_(Tensor& t, double mean, double std, Generator& gen);
// 0/1 draws with probability p per element (same dtype as p), or a constant p.
Tensor bernoulli(const Tensor& p, Generator& gen);
Tensor bernoulli(const Tensor& p);
Tensor& bernoulli_(Tensor& t, double p, Generator& gen);

}  // namespace gw
