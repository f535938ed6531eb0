#include <catch2/catch.hpp>

#include "optim/optimizer.h"

TEST_CASE("optimizer placeholder", "[optim]") { CHECK(true); }
