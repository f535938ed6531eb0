// Views of gw::Tensor (view, reshape, transpose, t, permute, slice, narrow, select, expand,
// squeeze/unsqueeze, flatten): the elements they address, read straight from storage, and that
// they share storage with their base (writes show through, the version counter moves).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "core/ops.h"
#include "test_util.h"

using core_test::at;
using core_test::iota;
using core_test::version;
using gw::Shape;
using gw::Tensor;

// --- views ----------------------------------------------------------------------------------

TEST_CASE("view reinterprets the shape over the same storage", "[core][tensor][view]") {
  Tensor b = iota({2, 3, 4});
  Tensor v = b.view({6, 4});
  CHECK(v.sizes() == Shape{6, 4});
  CHECK(v.strides() == Shape{4, 1});
  CHECK(v.storage() == b.storage());
  CHECK(v.to_vector<float>() == b.to_vector<float>());
  CHECK(b.view({-1}).sizes() == Shape{24});
  CHECK(b.view({4, -1, 2}).sizes() == Shape{4, 3, 2});
  CHECK(b.view({1, 24, 1}).sizes() == Shape{1, 24, 1});

  uint64_t v0 = version(b);
  v.select(0, 1).fill_(100.f);  // row 1 of the (6,4) view is b[0][1]
  CHECK(version(b) > v0);
  for (int64_t k = 0; k < 4; ++k) CHECK(at(b, {0, 1, k}) == 100.f);
  CHECK(at(b, {0, 0, 3}) == 3.f);
  CHECK(at(b, {0, 2, 0}) == 8.f);

  SECTION("view of a view with compatible strides") {
    Tensor s = b.select(2, 1);  // (2,3), strides (12,4)
    Tensor u = s.view({2, 3, 1});
    CHECK(u.storage() == b.storage());
    CHECK(at(u, {1, 2, 0}) == at(b, {1, 2, 1}));
    Tensor w = b.transpose(0, 2).view({4, 3, 2});  // same shape: always viewable
    CHECK(w.strides() == b.transpose(0, 2).strides());
  }
  SECTION("a 0-dim tensor views as (1) and back") {
    Tensor z = gw::scalar_tensor(3.0);
    Tensor one = z.view({1});
    CHECK(one.sizes() == Shape{1});
    CHECK(one.view({}).dim() == 0);
    CHECK(one.storage() == z.storage());
  }
}

TEST_CASE("reshape is a view when strides allow and a copy otherwise", "[core][tensor][view]") {
  Tensor b = iota({2, 3, 4});
  SECTION("contiguous input: a view") {
    Tensor r = b.reshape({3, 8});
    CHECK(r.storage() == b.storage());
    CHECK(r.to_vector<float>() == b.to_vector<float>());
    CHECK(gw::reshape(b, {-1, 2}).sizes() == Shape{12, 2});
  }
  SECTION("splitting a dim of a transposed input: still a view") {
    Tensor t = b.transpose(0, 1);  // (3,2,4)
    Tensor r = t.reshape({3, 2, 2, 2});
    CHECK(r.storage() == b.storage());
    CHECK(at(r, {2, 1, 1, 0}) == at(t, {2, 1, 2}));
  }
  SECTION("merging non-adjacent memory: a copy with the right values") {
    Tensor t = b.transpose(0, 1);  // (3,2,4)
    Tensor r = t.reshape({3, 8});
    CHECK(r.storage() != b.storage());
    CHECK(r.is_contiguous());
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t i = 0; i < 2; ++i)
        for (int64_t k = 0; k < 4; ++k) CHECK(at(r, {j, i * 4 + k}) == at(b, {i, j, k}));
    r.fill_(-1.f);  // the copy is independent
    CHECK(at(b, {0, 0, 0}) == 0.f);
  }
}

TEST_CASE("transpose and t swap dims without copying", "[core][tensor][view]") {
  Tensor b = iota({2, 3, 4});
  Tensor t = b.transpose(0, 2);
  CHECK(t.sizes() == Shape{4, 3, 2});
  CHECK(t.strides() == Shape{1, 4, 12});
  CHECK(t.storage() == b.storage());
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) CHECK(at(t, {k, j, i}) == at(b, {i, j, k}));
  CHECK(b.transpose(-1, 0).sizes() == t.sizes());
  CHECK(b.transpose(1, 1).strides() == b.strides());

  uint64_t v0 = version(b);
  t.select(0, 3).fill_(-5.f);  // k == 3 in the base
  CHECK(version(b) > v0);
  CHECK(at(b, {1, 2, 3}) == -5.f);
  CHECK(at(b, {1, 2, 2}) == 22.f);

  Tensor m = iota({2, 3});
  CHECK(m.t().sizes() == Shape{3, 2});
  CHECK(at(m.t(), {2, 1}) == 5.f);
  CHECK(m.t().t().strides() == m.strides());
  Tensor v = iota({5});
  CHECK(v.t().sizes() == Shape{5});
  CHECK(gw::scalar_tensor(1.0).t().dim() == 0);
}

TEST_CASE("permute reorders dims", "[core][tensor][view]") {
  Tensor b = iota({2, 3, 4});
  Tensor p = b.permute({2, 0, 1});
  CHECK(p.sizes() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  CHECK(p.storage() == b.storage());
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) CHECK(at(p, {k, i, j}) == at(b, {i, j, k}));
  CHECK(b.permute({-1, -3, -2}).strides() == p.strides());
  CHECK(gw::permute(b, {0, 1, 2}).strides() == b.strides());
  p.select(0, 0).select(0, 1).fill_(7.f);  // b[1][:][0]
  for (int64_t j = 0; j < 3; ++j) CHECK(at(b, {1, j, 0}) == 7.f);
}

TEST_CASE("slice follows Python slice semantics", "[core][tensor][view]") {
  Tensor b = iota({2, 3, 4});
  SECTION("with a step") {
    Tensor s = b.slice(2, 1, 4, 2);  // k in {1, 3}
    CHECK(s.sizes() == Shape{2, 3, 2});
    CHECK(s.strides() == Shape{12, 4, 2});
    CHECK(s.storage_offset() == 1);
    CHECK(at(s, {1, 2, 1}) == at(b, {1, 2, 3}));
    CHECK(b.slice(2, 0, 4, 3).sizes() == Shape{2, 3, 2});  // {0, 3}
    CHECK(at(b.slice(2, 0, 4, 3), {0, 0, 1}) == 3.f);
    CHECK(b.slice(2, 0, 4, 5).sizes() == Shape{2, 3, 1});
  }
  SECTION("negative and out-of-range bounds") {
    Tensor s = b.slice(1, -2, 3);  // j in {1, 2}
    CHECK(s.sizes() == Shape{2, 2, 4});
    CHECK(at(s, {0, 0, 0}) == at(b, {0, 1, 0}));
    CHECK(b.slice(-1, -100, 100).sizes() == b.sizes());
    CHECK(b.slice(1, 0, -1).sizes() == Shape{2, 2, 4});
    CHECK(b.slice(0, 5, 10).sizes() == Shape{0, 3, 4});
    CHECK(b.slice(1, 2, 1).sizes() == Shape{2, 0, 4});  // end before start: empty
  }
  SECTION("writes go to the base") {
    Tensor s = b.slice(0, 1, 2).slice(2, 1, 4, 2);
    uint64_t v0 = version(b);
    s.fill_(-1.f);
    CHECK(version(b) > v0);
    CHECK(at(b, {1, 0, 1}) == -1.f);
    CHECK(at(b, {1, 2, 3}) == -1.f);
    CHECK(at(b, {1, 0, 2}) == 14.f);
    CHECK(at(b, {0, 0, 1}) == 1.f);
  }
}

TEST_CASE("narrow is a slice of given length", "[core][tensor][view]") {
  Tensor b = iota({2, 3, 4});
  Tensor n = b.narrow(1, 1, 2);
  CHECK(n.sizes() == Shape{2, 2, 4});
  CHECK(n.storage() == b.storage());
  CHECK(at(n, {1, 0, 3}) == at(b, {1, 1, 3}));
  Tensor neg = gw::narrow(b, -1, -2, 2);  // the last two columns
  CHECK(neg.sizes() == Shape{2, 3, 2});
  CHECK(at(neg, {0, 0, 0}) == 2.f);
  CHECK(b.narrow(0, 2, 0).numel() == 0);
  n.fill_(0.f);
  CHECK(at(b, {0, 1, 0}) == 0.f);
  CHECK(at(b, {0, 0, 0}) == 0.f);  // was 0 already
  CHECK(at(b, {0, 0, 1}) == 1.f);
}

TEST_CASE("select and operator[] drop a dim", "[core][tensor][view]") {
  Tensor b = iota({2, 3, 4});
  Tensor s = b.select(1, -1);  // j == 2
  CHECK(s.sizes() == Shape{2, 4});
  CHECK(s.storage() == b.storage());
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t k = 0; k < 4; ++k) CHECK(at(s, {i, k}) == at(b, {i, 2, k}));
  Tensor r = b[1][2];
  CHECK(r.sizes() == Shape{4});
  CHECK(at(r, {3}) == 23.f);
  Tensor e = b[1][2][3];
  CHECK(e.dim() == 0);
  CHECK(e.item<float>() == 23.f);
  uint64_t v0 = version(b);
  e.fill_(-3.f);
  CHECK(version(b) > v0);
  CHECK(at(b, {1, 2, 3}) == -3.f);
  CHECK(gw::select(b, 0, 0).sizes() == Shape{3, 4});
}

TEST_CASE("expand repeats size-1 dims with stride 0", "[core][tensor][view]") {
  Tensor col = iota({3, 1});
  Tensor e = col.expand({2, 3, 4});
  CHECK(e.sizes() == Shape{2, 3, 4});
  CHECK(e.strides() == Shape{0, 1, 0});
  CHECK(e.storage() == col.storage());
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) CHECK(at(e, {i, j, k}) == static_cast<float>(j));
  CHECK(col.expand({-1, 5}).sizes() == Shape{3, 5});
  CHECK(col.expand({3, 0}).numel() == 0);
  CHECK(col.expand_as(gw::zeros({3, 2})).sizes() == Shape{3, 2});
  CHECK(gw::broadcast_to(gw::scalar_tensor(1.0), {2, 2}).strides() == Shape{0, 0});

  col.select(0, 2).fill_(9.f);  // a write to the base shows through every repeat
  CHECK(at(e, {1, 2, 3}) == 9.f);
  CHECK(e.to_vector<float>()[23] == 9.f);
}

TEST_CASE("squeeze and unsqueeze remove and add size-1 dims", "[core][tensor][view]") {
  Tensor b = iota({1, 3, 1, 2});
  CHECK(b.squeeze().sizes() == Shape{3, 2});
  CHECK(b.squeeze().strides() == Shape{2, 1});
  CHECK(b.squeeze(0).sizes() == Shape{3, 1, 2});
  CHECK(b.squeeze(1).sizes() == b.sizes());  // size 3: unchanged
  CHECK(b.squeeze(-2).sizes() == Shape{1, 3, 2});
  CHECK(b.squeeze().storage() == b.storage());
  CHECK(gw::squeeze(gw::zeros({1, 1})).dim() == 0);

  Tensor m = iota({2, 3});
  Tensor u0 = m.unsqueeze(0), u1 = m.unsqueeze(1), ul = m.unsqueeze(-1);
  CHECK(u0.sizes() == Shape{1, 2, 3});
  CHECK(u1.sizes() == Shape{2, 1, 3});
  CHECK(ul.sizes() == Shape{2, 3, 1});
  CHECK(u1.storage() == m.storage());
  CHECK(at(u1, {1, 0, 2}) == 5.f);
  CHECK(at(ul, {1, 2, 0}) == 5.f);
  CHECK(u1.is_contiguous());
  CHECK(gw::unsqueeze(gw::scalar_tensor(1.0), 0).sizes() == Shape{1});
  // unsqueeze of a transposed view keeps addressing the right elements
  Tensor tu = m.t().unsqueeze(1);
  CHECK(tu.sizes() == Shape{3, 1, 2});
  CHECK(at(tu, {2, 0, 1}) == 5.f);
  u0.select(1, 0).fill_(-1.f);
  CHECK(at(m, {0, 2}) == -1.f);
}

TEST_CASE("flatten merges a range of dims", "[core][tensor][view]") {
  Tensor b = iota({2, 3, 4});
  CHECK(b.flatten().sizes() == Shape{24});
  CHECK(b.flatten().storage() == b.storage());
  CHECK(b.flatten(1).sizes() == Shape{2, 12});
  CHECK(b.flatten(0, 1).sizes() == Shape{6, 4});
  CHECK(gw::flatten(b, -2, -1).sizes() == Shape{2, 12});
  CHECK(b.flatten(1, 1).sizes() == b.sizes());
  CHECK(gw::scalar_tensor(2.0).flatten().sizes() == Shape{1});
  Tensor t = b.transpose(0, 2).flatten();  // needs a copy, in the transposed order
  std::vector<float> expected;
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i) expected.push_back(static_cast<float>(i * 12 + j * 4 + k));
  CHECK(t.to_vector<float>() == expected);
}
