// The single translation unit that compiles Catch2's main.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdlib>

int main(int argc, char* argv[]) {
  // Hermetic suites: a job key, an opt-out, a bind address, TLS files or an interface in the
  // developer's environment would change what the tests (and the processes they start) see;
  // they pass their own.
  for (const char* v :
       {"GW_JOB_KEY_FILE", "GW_ALLOW_UNAUTHENTICATED", "GW_STORE_BIND_ADDRESS", "GW_TLS_CERT_FILE",
        "GW_TLS_KEY_FILE", "GW_TLS_CA_FILE", "GW_SOCKET_IFNAME"})
    ::unsetenv(v);
  return Catch::Session().run(argc, argv);
}
