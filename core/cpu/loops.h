// The strided iteration engine of the CPU kernels. All operands of an elementwise kernel share
// one shape (inputs are expanded views); each has its own strides. `for_each_row` collapses
// the dims that can be merged, then calls `row(ptrs, inner_strides, n)` once per innermost
// row with byte pointers and byte strides, splitting rows across threads for large tensors.
// Kernels switch on the inner strides to run a contiguous loop the compiler vectorizes.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "core/parallel.h"
#include "core/tensor.h"

namespace gw::cpu {

// Elements per parallel chunk: below this, threading costs more than it gains.
inline constexpr int64_t kParallelGrain = 32768;

template <size_t N>
struct Operands {
  std::array<char*, N> data;
  Shape shape;                             // collapsed
  std::array<std::vector<int64_t>, N> strides;  // bytes, collapsed
};

// Collapses dims of `shape` for operands with the given element strides and item sizes.
template <size_t N>
Operands<N> collapse(std::span<const int64_t> shape, const std::array<const Tensor*, N>& ts) {
  Operands<N> ops;
  for (size_t k = 0; k < N; ++k) ops.data[k] = static_cast<char*>(ts[k]->raw_data());
  // Drop size-1 dims; merge dim i into i+1 when every operand is contiguous across them.
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    std::array<int64_t, N> st;
    for (size_t k = 0; k < N; ++k) {
      st[k] = ts[k]->strides()[i] * static_cast<int64_t>(ts[k]->element_size());
    }
    if (!ops.shape.empty()) {
      bool mergeable = true;
      for (size_t k = 0; k < N; ++k) {
        mergeable &= ops.strides[k].back() == st[k] * shape[i];
      }
      if (mergeable) {
        ops.shape.back() *= shape[i];
        for (size_t k = 0; k < N; ++k) ops.strides[k].back() = st[k];
        continue;
      }
    }
    ops.shape.push_back(shape[i]);
    for (size_t k = 0; k < N; ++k) ops.strides[k].push_back(st[k]);
  }
  if (ops.shape.empty()) {  // 0-dim or all ones: one element
    ops.shape.push_back(1);
    for (size_t k = 0; k < N; ++k) ops.strides[k].push_back(0);
  }
  return ops;
}

// Calls row(ptrs, inner_strides, n) for rows [row_begin, row_end) of the collapsed operands.
template <size_t N, typename Row>
void run_rows(const Operands<N>& ops, int64_t row_begin, int64_t row_end, Row& row) {
  const size_t nd = ops.shape.size();
  const int64_t inner = ops.shape[nd - 1];
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = ops.strides[k][nd - 1];
  // Unravel row_begin into a counter over the outer dims.
  std::vector<int64_t> counter(nd > 1 ? nd - 1 : 0, 0);
  std::array<char*, N> ptrs = ops.data;
  int64_t r = row_begin;
  for (size_t d = nd - 1; d-- > 0;) {
    counter[d] = r % ops.shape[d];
    r /= ops.shape[d];
    for (size_t k = 0; k < N; ++k) ptrs[k] += counter[d] * ops.strides[k][d];
  }
  for (int64_t i = row_begin; i < row_end; ++i) {
    row(ptrs, inner_strides, inner);
    // Advance the counter (odometer), moving pointers by strides.
    for (size_t d = nd - 1; d-- > 0;) {
      for (size_t k = 0; k < N; ++k) ptrs[k] += ops.strides[k][d];
      if (++counter[d] < ops.shape[d]) break;
      for (size_t k = 0; k < N; ++k) ptrs[k] -= ops.strides[k][d] * ops.shape[d];
      counter[d] = 0;
    }
  }
}

template <size_t N, typename Row>
void for_each_row(std::span<const int64_t> shape, const std::array<const Tensor*, N>& ts,
                  Row&& row) {
  const int64_t count = numel(shape);
  if (count == 0) return;
  // Fast path (no allocation): every operand contiguous, so the whole tensor is one row.
  bool all_contiguous = true;
  for (size_t k = 0; k < N; ++k) all_contiguous &= ts[k]->is_contiguous();
  if (all_contiguous && (count < kParallelGrain || get_num_threads() == 1)) {
    std::array<char*, N> p;
    std::array<int64_t, N> s;
    for (size_t k = 0; k < N; ++k) {
      p[k] = static_cast<char*>(ts[k]->raw_data());
      s[k] = static_cast<int64_t>(ts[k]->element_size());
    }
    row(p, s, count);
    return;
  }
  Operands<N> ops = collapse<N>(shape, ts);
  const int64_t inner = ops.shape.back();
  const int64_t rows = numel(ops.shape) / inner;
  const int64_t total = rows * inner;
  if (total < kParallelGrain || get_num_threads() == 1) {
    run_rows(ops, 0, rows, row);
    return;
  }
  if (rows == 1) {
    // One long row: split it into pieces.
    parallel_for(0, inner, kParallelGrain, [&](int64_t b, int64_t e) {
      std::array<char*, N> p = ops.data;
      std::array<int64_t, N> s;
      for (size_t k = 0; k < N; ++k) {
        s[k] = ops.strides[k].back();
        p[k] += b * s[k];
      }
      row(p, s, e - b);
    });
    return;
  }
  int64_t grain = std::max<int64_t>(1, kParallelGrain / inner);
  parallel_for(0, rows, grain, [&](int64_t b, int64_t e) { run_rows(ops, b, e, row); });
}

}  // namespace gw::cpu
