// The precompiled header of the lowest layers (core, store, debug): the standard headers most
// of their files include, parsed once per library instead of once per file. The layers above
// use pch/gradwire_pch.h, which adds the tensor. Each file still includes what it uses: the
// shared-library build (`./gw test --shared`, which CI runs) builds without precompiled
// headers (-Db_pch=false) and so shows a file that forgets an include.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
