// The two hashes the Hub names files by: the sha256 of an LFS file's content, and the git blob
// sha1 (of "blob <size>\0" + content) of a file stored in git. The cache names each blob by the
// one that applies, so a download is checked against the name it will be stored under.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace torchtpu::hub {

enum class DigestKind { kSha256, kGitBlobSha1 };

// Incremental hashing (OpenSSL's libcrypto). For kGitBlobSha1, `size` is the content's length,
// which git hashes first.
class Digest {
 public:
  Digest(DigestKind kind, int64_t size);
  ~Digest();
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;
  void update(const void* data, size_t n);
  // Lower-case hex; the digest cannot be updated afterwards.
  std::string hex();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Hashes the first `size` bytes of `path` into `d` (used to pick up a partial download).
void update_from_file(Digest& d, const std::string& path, int64_t size);

}  // namespace torchtpu::hub
