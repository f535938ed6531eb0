#include "tests/tls_pki.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace gw::test {
namespace {

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("test PKI: ") + what + " failed");
}

EVP_PKEY* new_key() {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  check(key != nullptr, "EVP_EC_gen");
  return key;
}

void add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  check(ext != nullptr && X509_add_ext(cert, ext, -1) == 1, "X509_add_ext");
  X509_EXTENSION_free(ext);
}

// A certificate for `name` with `key`, signed by `issuer_key` (self-signed when `issuer` is null).
X509* make_cert(const std::string& name, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key,
                bool is_ca) {
  static long serial = 1;
  X509* cert = X509_new();
  check(cert != nullptr, "X509_new");
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), serial++);
  X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert), 24 * 3600);
  X509_set_pubkey(cert, key);
  X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert, X509_get_subject_name(issuer ? issuer : cert));
  add_extension(cert, issuer ? issuer : cert, NID_basic_constraints,
                is_ca ? "critical,CA:TRUE" : "critical,CA:FALSE");
  add_extension(cert, issuer ? issuer : cert, NID_key_usage,
                is_ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature");
  check(X509_sign(cert, issuer_key, EVP_sha256()) > 0, "X509_sign");
  return cert;
}

void write_pem(const std::filesystem::path& path, X509* cert, EVP_PKEY* key) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, key ? 0600 : 0644);
  FILE* f = fd >= 0 ? ::fdopen(fd, "w") : nullptr;
  check(f != nullptr, "open");
  const bool ok = cert ? PEM_write_X509(f, cert) == 1
                       : PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  std::fclose(f);
  check(ok, "PEM_write");
}

}  // namespace

struct Pki::Ca {
  EVP_PKEY* key = new_key();
  X509* cert = nullptr;
  ~Ca() {
    X509_free(cert);
    EVP_PKEY_free(key);
  }
};

Pki::Pki() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "gw-pki-XXXXXX").string();
  check(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp");
  dir_ = tmpl;
  ca_ = std::make_unique<Ca>();
  ca_->cert = make_cert("gradwire test CA", ca_->key, nullptr, ca_->key, true);
  write_pem(dir_ / "ca.pem", ca_->cert, nullptr);
}

Pki::~Pki() {
  ca_.reset();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

store::TlsOptions Pki::issue(const std::string& name) {
  EVP_PKEY* key = new_key();
  X509* cert = make_cert(name, key, ca_->cert, ca_->key, false);
  const auto cert_file = dir_ / (name + ".pem"), key_file = dir_ / (name + ".key");
  write_pem(cert_file, cert, nullptr);
  write_pem(key_file, nullptr, key);
  X509_free(cert);
  EVP_PKEY_free(key);
  return {cert_file.string(), key_file.string(), (dir_ / "ca.pem").string()};
}

}  // namespace gw::test
