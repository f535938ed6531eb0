#include <catch2/catch.hpp>

#include "nn/module.h"

TEST_CASE("a bare Module has no forward", "[nn][module]") {
  gw::nn::Module m;
  CHECK_THROWS_AS(m.forward(gw::Tensor()), gw::StateError);
}
