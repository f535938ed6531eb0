#!/usr/bin/env bash
# The `consumers` test: installs this build into a scratch directory and builds app.cpp against
# it as a program outside the project would, twice: with nothing but
# `g++ app.cpp $(pkg-config --cflags --libs gradwire)`, and as a CMake project with
# find_package(gradwire). Each program must run and print "consumer ok".
#   check.sh <build dir> <this folder>
set -euo pipefail
build=$1 here=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

meson install -C "$build" --destdir "$work/root" --no-rebuild >"$work/install.log" ||
  { cat "$work/install.log"; exit 1; }
pc=$(find "$work/root" -name gradwire.pc)
config=$(find "$work/root" -name gradwireConfig.cmake)
[[ -n $pc && -n $config ]] || { echo "no gradwire.pc or gradwireConfig.cmake was installed"; exit 1; }

# Shared libraries (./gw test --shared) are found where they were installed, as a user's
# LD_LIBRARY_PATH (or a system prefix) would find them.
export LD_LIBRARY_PATH=$(dirname "$(dirname "$pc")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

export PKG_CONFIG_PATH=$(dirname "$pc")

echo "pkg-config: g++ app.cpp \$(pkg-config --cflags --libs gradwire)"
g++ "$here/app.cpp" -o "$work/app-pkg-config" $(pkg-config --cflags --libs gradwire)
[[ $("$work/app-pkg-config") == "consumer ok" ]]

echo "CMake: find_package(gradwire), target_link_libraries(app PRIVATE gradwire::gradwire)"
cmake -S "$here" -B "$work/cmake" -Dgradwire_DIR="$(dirname "$config")" >"$work/cmake.log" ||
  { cat "$work/cmake.log"; exit 1; }
cmake --build "$work/cmake" >>"$work/cmake.log" || { cat "$work/cmake.log"; exit 1; }
[[ $("$work/cmake/app") == "consumer ok" ]]
echo "both consumers built and ran"
