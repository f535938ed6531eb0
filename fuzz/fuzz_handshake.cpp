// libFuzzer target: the job-key handshake (store/job_key.h) fed by an adversary. A server
// reads a fuzzed hello and proof, a client a fuzzed challenge. Neither may crash, and with a key
// the fuzzer cannot know (random per process) neither may ever accept.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "store/job_key.h"

using namespace gw::dist;
using namespace gw::store::auth;

namespace {
// Copies the next bytes of the input into `out` (zeros past its end).
template <size_t N>
void take(const uint8_t*& data, size_t& size, std::array<uint8_t, N>& out) {
  const size_t n = std::min(size, N);
  std::copy(data, data + n, out.begin());
  data += n, size -= n;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const JobKey key = JobKey::generate();
  Hello hello{};
  Proof proof{};
  Challenge challenge{};
  take(data, size, hello);
  take(data, size, proof);
  take(data, size, challenge);
  try {
    ServerHandshake server(key, Purpose::kRpc, {"worker1", 1});
    server.read_hello(hello);
    server.check_proof(proof);
    std::abort();  // a client proved a key it does not have
  } catch (const gw::Error&) {
  }
  try {
    ClientHandshake client(key, Purpose::kRpc, {"worker0", 0});
    client.answer(challenge, {"worker1", 1});
    std::abort();  // a server proved a key it does not have
  } catch (const gw::Error&) {
  }
  return 0;
}
