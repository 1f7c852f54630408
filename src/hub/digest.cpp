#include "hub/digest.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <vector>

namespace torchtpu::hub {

struct Digest::Impl {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~Impl() { EVP_MD_CTX_free(ctx); }
};

Digest::Digest(DigestKind kind, int64_t size) : impl_(std::make_unique<Impl>()) {
  const EVP_MD* md = kind == DigestKind::kSha256 ? EVP_sha256() : EVP_sha1();
  if (impl_->ctx == nullptr || EVP_DigestInit_ex(impl_->ctx, md, nullptr) != 1) {
    throw std::runtime_error("OpenSSL could not start a digest");
  }
  if (kind == DigestKind::kGitBlobSha1) {
    std::string header = "blob " + std::to_string(size);
    update(header.data(), header.size() + 1);  // git hashes the terminating NUL too
  }
}

Digest::~Digest() = default;

void Digest::update(const void* data, size_t n) {
  if (EVP_DigestUpdate(impl_->ctx, data, n) != 1) {
    throw std::runtime_error("OpenSSL digest update failed");
  }
}

std::string Digest::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(impl_->ctx, md, &len) != 1) {
    throw std::runtime_error("OpenSSL digest final failed");
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 15];
  }
  return out;
}

void update_from_file(Digest& d, const std::string& path, int64_t size) {
  std::unique_ptr<FILE, decltype(&fclose)> f(fopen(path.c_str(), "rb"), fclose);
  if (!f) throw std::runtime_error("cannot read " + path + " to hash it");
  std::vector<char> buf(1 << 20);
  int64_t left = size;
  while (left > 0) {
    size_t want = static_cast<size_t>(std::min<int64_t>(left, buf.size()));
    size_t got = fread(buf.data(), 1, want, f.get());
    if (got == 0) throw std::runtime_error("cannot read " + path + " to hash it: file too short");
    d.update(buf.data(), got);
    left -= static_cast<int64_t>(got);
  }
}

}  // namespace torchtpu::hub
