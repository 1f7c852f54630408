// The huggingface_hub cache layout, shared with Python tools:
//   <cache>/models--org--name/blobs/<etag>                 file contents, named by their hash
//   <cache>/models--org--name/snapshots/<commit>/<path>    relative symlinks to ../../blobs/<etag>
//   <cache>/models--org--name/refs/<revision>              the commit a branch or tag resolved to
//   <cache>/models--org--name/trees/<commit>.json          the repo's listing at that commit
//   <cache>/.locks/models--org--name/<etag>.lock           flock(2) held while a blob is written
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hub/files.h"

namespace torchtpu::hub {

// "org/name" -> "models--org--name".
std::string repo_folder_name(const std::string& repo_id);

class RepoCache {
 public:
  RepoCache(const std::filesystem::path& cache_dir, const std::string& repo_id);

  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path blob(const std::string& etag) const;
  std::filesystem::path snapshot(const std::string& commit) const;
  std::filesystem::path pointer(const std::string& commit, const std::string& path) const;
  std::filesystem::path lock_file(const std::string& etag) const;

  // The commit refs/<revision> names, or "" when it is not cached.
  std::string read_ref(const std::string& revision) const;
  void write_ref(const std::string& revision, const std::string& commit) const;

  // huggingface_hub's tree cache (format_version 1); nullopt when absent or unreadable.
  std::optional<std::vector<RepoFile>> read_tree(const std::string& commit) const;
  void write_tree(const std::string& commit, const std::vector<RepoFile>& files) const;

  // Points snapshots/<commit>/<path> at blobs/<etag> with a relative symlink, or copies the blob
  // there where the file system has no symlinks.
  void link(const std::string& commit, const std::string& path, const std::string& etag) const;

  // Marks the cache root for backup tools (CACHEDIR.TAG), as huggingface_hub does.
  void tag_cache_dir() const;

 private:
  std::filesystem::path cache_dir_;
  std::string folder_;
  std::filesystem::path root_;
};

// The symlink target that leads from `link` to `target` (both absolute or both relative to the
// same directory), e.g. "../../blobs/<etag>".
std::filesystem::path relative_link_target(const std::filesystem::path& link,
                                           const std::filesystem::path& target);

// Throws std::runtime_error naming `dir`, the need and what is free when `dir`'s file system has
// fewer than `bytes` bytes available.
void ensure_free_space(const std::filesystem::path& dir, int64_t bytes, const std::string& what);

// An exclusive flock(2) on a lock file, the kind huggingface_hub's filelock takes, so that
// Python and this program never write the same blob at once.
class FileLock {
 public:
  // Blocks until the lock is held; `on_wait` is called once if another process holds it.
  FileLock(const std::filesystem::path& path, const std::function<void()>& on_wait);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace torchtpu::hub
