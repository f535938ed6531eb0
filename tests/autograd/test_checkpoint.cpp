// Activation checkpointing (autograd::checkpoint) and end-of-backward callbacks
// (autograd::queue_callback): gradients equal the plain computation's; a parameter used inside
// and outside a segment accumulates once per pass; callbacks run after the last node.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "autograd/activation_checkpoint.h"
#include "autograd/autograd.h"
#include "core/ops.h"
#include "core/random.h"

using namespace gw;
namespace ag = gw::autograd;

namespace {
// A two-layer block over explicit weights, used inside a segment and outside it.
struct Block {
  Tensor w, b;
  explicit Block(Generator& gen)
      : w(randn({5, 5}, gen, kFloat64).requires_grad_()),
        b(randn({5}, gen, kFloat64).requires_grad_()) {}
  Tensor operator()(const Tensor& x) const { return (matmul(x, w) + b).tanh(); }
};

struct Grads {
  Tensor w, b, x;
};

// loss = sum(block(segment(stem(x)))^2), with segment = block, checkpointed or not.
Grads run(bool checkpointed, int* w_hook_fired = nullptr) {
  Generator gen(5);
  Block block(gen);
  Tensor x = randn({3, 5}, gen, kFloat64).requires_grad_();
  if (w_hook_fired)
    ag::register_post_accumulate_grad_hook(block.w,
                                           [w_hook_fired](const Tensor&) { ++*w_hook_fired; });
  Tensor h = x * 2;
  Tensor mid =
      checkpointed ? ag::checkpoint([&](const Tensor& t) { return block(t); }, h) : block(h);
  (block(mid) * block(mid)).sum().backward();
  return {block.w.grad(), block.b.grad(), x.grad()};
}
}  // namespace

TEST_CASE("checkpoint: gradients equal those of the plain computation", "[autograd][checkpoint]") {
  const Grads plain = run(false), ckpt = run(true);
  REQUIRE(ckpt.w.defined());
  CHECK(allclose(ckpt.w, plain.w, 1e-12, 1e-12));
  CHECK(allclose(ckpt.b, plain.b, 1e-12, 1e-12));
  CHECK(allclose(ckpt.x, plain.x, 1e-12, 1e-12));
}

TEST_CASE("checkpoint: the recomputation draws what the first run drew", "[autograd][checkpoint]") {
  // A segment that drops half its elements twice: with a generator of its own (as a Dropout
  // module's), then with the default one. Its gradients equal the plain run's with the same
  // seeds only if the recomputation draws the same masks (without preserve_rng_state it draws
  // the next ones), and both generators are then where they were before the backward.
  auto grad_of_x = [](int how) {  // 0: plain, 1: checkpointed, 2: without preserve_rng_state
    Generator gen(11), own(12);
    manual_seed(13);
    Tensor x = randn({4, 6}, gen, kFloat64).requires_grad_();
    auto segment = [&](const Tensor& t) {
      const Tensor a = t.tanh() * lt(rand({4, 6}, own, kFloat64), 0.5).to(kFloat64);
      return a.tanh() * lt(rand({4, 6}, kFloat64), 0.5).to(kFloat64);
    };
    const ag::CheckpointOptions keep{.generators = {&own}};
    const Tensor y = how == 0   ? segment(x * 3)
                     : how == 1 ? ag::checkpoint(segment, x * 3, keep)
                                : ag::checkpoint(segment, x * 3, {.preserve_rng_state = false});
    rand({3}, own, kFloat64);  // draws after the segment (another layer's dropout, say)
    rand({3}, kFloat64);
    y.sum().backward();
    // What each generator draws next: the backward put it back where it was.
    return std::vector<Tensor>{x.grad(), rand({1}, own, kFloat64), rand({1}, kFloat64)};
  };
  const auto plain = grad_of_x(0), kept = grad_of_x(1), fresh = grad_of_x(2);
  CHECK(equal(kept[0], plain[0]));
  CHECK(!equal(fresh[0], plain[0]));  // other masks
  CHECK(equal(kept[1], plain[1]));
  CHECK(equal(kept[2], plain[2]));
}

TEST_CASE("checkpoint: a parameter used inside and outside a segment accumulates once per pass",
          "[autograd][checkpoint]") {
  int plain_fired = 0, ckpt_fired = 0;
  run(false, &plain_fired);
  run(true, &ckpt_fired);
  CHECK(plain_fired == 1);  // the engine sums the two uses before accumulating
  CHECK(ckpt_fired == 2);   // the segment's reentrant pass accumulates on its own
}

TEST_CASE("checkpoint: the segment is recomputed in backward, not kept", "[autograd][checkpoint]") {
  Generator gen(1);
  Tensor x = randn({4}, gen, kFloat64).requires_grad_();
  int runs = 0;
  Tensor y = ag::checkpoint(
      [&](const Tensor& t) {
        ++runs;
        return (t * t).tanh();
      },
      x);
  CHECK(runs == 1);
  CHECK_FALSE(y.grad_fn() == nullptr);
  CHECK(y.grad_fn()->name() == "CheckpointFunctionBackward");
  y.sum().backward(Tensor(), /*retain_graph=*/true);
  CHECK(runs == 2);
  const Tensor first = x.grad().clone();
  const Tensor th = (x * x).tanh();
  CHECK(allclose(first, (1 - th * th) * x * 2, 1e-12, 1e-12));
  y.sum().backward();  // retained: recomputed again, accumulates
  CHECK(runs == 3);
  CHECK(allclose(x.grad(), first * 2, 1e-12, 1e-12));
  CHECK_THROWS_WITH(y.sum().backward(), Catch::Contains("a second time"));
}

TEST_CASE("checkpoint: several inputs and outputs; inputs without grad; bad arguments",
          "[autograd][checkpoint]") {
  Generator gen(2);
  Tensor a = randn({3}, gen, kFloat64).requires_grad_();
  Tensor c = randn({3}, gen, kFloat64);  // no grad: none flows to it
  auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0] * in[1], in[0].exp(), in[0]};  // an input returned as is
  };
  auto out = ag::checkpoint(fn, {a, c});
  REQUIRE(out.size() == 3);
  (out[0].sum() + out[1].sum() * 2 + out[2].sum() * 3).backward();
  CHECK(allclose(a.grad(), c + a.exp() * 2 + 3, 1e-12, 1e-12));
  CHECK_FALSE(c.grad().defined());
  CHECK(a.grad_fn() == nullptr);  // returning `a` did not give it a history

  // No input requires grad: nothing is recorded (PyTorch's reentrant checkpoint, too).
  Tensor w = randn({3}, gen, kFloat64).requires_grad_();
  Tensor y = ag::checkpoint([&](const Tensor& t) { return t * w; }, c);
  CHECK_FALSE(y.requires_grad());

  CHECK_THROWS_AS(ag::checkpoint(ag::CheckpointFunction{}, {a}), InvalidArgumentError);
  CHECK_THROWS_WITH(ag::checkpoint(fn, {a, Tensor()}), Catch::Contains("input 1 is undefined"));
}

TEST_CASE("queue_callback: runs after the last node, in order; reentrant passes have their own",
          "[autograd][checkpoint]") {
  Generator gen(3);
  Tensor w = randn({4}, gen, kFloat64).requires_grad_();
  std::vector<std::string> log;
  ag::register_post_accumulate_grad_hook(w, [&](const Tensor&) { log.push_back("hook"); });
  Tensor inner = ag::checkpoint(
      [&](const Tensor& t) {
        Tensor r = t * w;
        if (r.requires_grad())  // the recomputation: queue from inside its pass
          r.register_hook([&](const Tensor&) {
            ag::queue_callback([&] { log.push_back("inner callback"); });
            return Tensor();
          });
        return r;
      },
      w * 1);
  Tensor out = inner * w;
  out.register_hook([&](const Tensor&) {
    ag::queue_callback([&] {
      log.push_back("outer callback 1");
      CHECK_FALSE(ag::is_grad_enabled());  // recording is off, as for hooks
      ag::queue_callback([&] { log.push_back("queued by a callback"); });
    });
    ag::queue_callback([&] { log.push_back("outer callback 2"); });
    return Tensor();
  });
  out.sum().backward();
  // The outer pass's callbacks wait for everything, the reentrant pass's hooks included.
  const std::vector<std::string> expected{"hook",
                                          "inner callback",
                                          "hook",
                                          "outer callback 1",
                                          "outer callback 2",
                                          "queued by a callback"};
  CHECK(log == expected);

  CHECK_THROWS_WITH(ag::queue_callback([] {}), Catch::Contains("no backward pass"));
  // A pass that throws runs none of its callbacks.
  bool ran = false;
  Tensor v = randn({2}, gen, kFloat64).requires_grad_();
  Tensor z = v * 2;
  z.register_hook([&](const Tensor&) -> Tensor {
    ag::queue_callback([&] { ran = true; });
    throw StateError("boom");
  });
  CHECK_THROWS_WITH(z.sum().backward(), Catch::Contains("boom"));
  CHECK_FALSE(ran);
}
