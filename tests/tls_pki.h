// A throwaway certificate authority for the TLS tests: a CA and the certificates it signs, made
// with OpenSSL's libcrypto (no `openssl` program needed) as PEM files in a private temporary
// directory that is removed with it.
//
//   gw::test::Pki pki;                                 // a fresh CA
//   gw::store::TlsOptions tls = pki.issue("worker0");   // cert, key (0600) and the CA's file
//   gw::test::Pki other;                               // a CA the first one does not trust
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "store/tls.h"

namespace gw::test {

class Pki {
 public:
  Pki();
  ~Pki();
  Pki(const Pki&) = delete;
  Pki& operator=(const Pki&) = delete;

  // A P-256 key and a certificate for `name` signed by this CA, valid for a day: the options
  // that use them, trusting this CA.
  store::TlsOptions issue(const std::string& name);
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  struct Ca;
  std::unique_ptr<Ca> ca_;
};

}  // namespace gw::test
