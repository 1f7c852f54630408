#include "hub/cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/errors.h"

namespace torchtpu::hub {
namespace fs = std::filesystem;
namespace {

constexpr int kTreeFormatVersion = 1;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return "";
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string random_suffix() {
  std::random_device rd;
  std::ostringstream ss;
  ss << std::hex << rd();
  return ss.str();
}

// Writes through a temporary file and a rename, so readers never see a half-written file.
void write_atomically(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  fs::path tmp = p;
  tmp += "." + random_suffix() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw std::runtime_error("cannot write " + p.string() + ": " + std::strerror(errno));
    }
  }
  fs::rename(tmp, p);
}

// A path taken from the Hub's listing, or a revision, must stay inside the folder it is joined
// to.
void check_relative(const std::string& path, const std::string& what) {
  fs::path p(path);
  bool bad = path.empty() || p.is_absolute();
  for (const auto& part : p) {
    if (part == ".." || part == "." || part.empty()) bad = true;
  }
  if (bad) throw FormatError(what + " '" + path + "' is not a plain relative path");
}

}  // namespace

std::string repo_folder_name(const std::string& repo_id) {
  std::string out = "models";
  size_t start = 0;
  while (true) {
    size_t slash = repo_id.find('/', start);
    out += "--" + repo_id.substr(start, slash - start);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return out;
}

RepoCache::RepoCache(const fs::path& cache_dir, const std::string& repo_id)
    : cache_dir_(cache_dir), folder_(repo_folder_name(repo_id)), root_(cache_dir / folder_) {}

fs::path RepoCache::blob(const std::string& etag) const { return root_ / "blobs" / etag; }

fs::path RepoCache::snapshot(const std::string& commit) const {
  return root_ / "snapshots" / commit;
}

fs::path RepoCache::pointer(const std::string& commit, const std::string& path) const {
  check_relative(path, "repo file");
  return snapshot(commit) / path;
}

fs::path RepoCache::lock_file(const std::string& etag) const {
  return cache_dir_ / ".locks" / folder_ / (etag + ".lock");
}

std::string RepoCache::read_ref(const std::string& revision) const {
  check_relative(revision, "revision");
  std::string text = read_text(root_ / "refs" / revision);
  size_t end = text.find_last_not_of(" \t\r\n");
  text = end == std::string::npos ? "" : text.substr(0, end + 1);
  return is_commit_hash(text) ? text : "";
}

void RepoCache::write_ref(const std::string& revision, const std::string& commit) const {
  check_relative(revision, "revision");
  if (revision == commit || read_ref(revision) == commit) return;
  write_atomically(root_ / "refs" / revision, commit);
}

std::optional<std::vector<RepoFile>> RepoCache::read_tree(const std::string& commit) const {
  std::string text = read_text(root_ / "trees" / (commit + ".json"));
  if (text.empty()) return std::nullopt;
  try {
    auto j = nlohmann::json::parse(text);
    if (j.at("format_version") != kTreeFormatVersion) return std::nullopt;
    std::vector<RepoFile> files;
    for (const auto& [path, e] : j.at("files").items()) {
      RepoFile f;
      f.path = path;
      f.size = e.at("size").get<int64_t>();
      f.blob_id = e.at("blob_id").get<std::string>();
      if (e.contains("lfs_sha256") && e["lfs_sha256"].is_string()) {
        f.lfs_sha256 = e["lfs_sha256"].get<std::string>();
      }
      files.push_back(std::move(f));
    }
    return files;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // huggingface_hub too ignores a tree cache it cannot read
  }
}

void RepoCache::write_tree(const std::string& commit, const std::vector<RepoFile>& files) const {
  nlohmann::json entries = nlohmann::json::object();
  for (const auto& f : files) {
    nlohmann::json e = {{"size", f.size}, {"blob_id", f.blob_id}};
    if (!f.lfs_sha256.empty()) {
      e["lfs_sha256"] = f.lfs_sha256;
      e["lfs_size"] = f.size;
    }
    entries[f.path] = std::move(e);
  }
  nlohmann::json j = {{"format_version", kTreeFormatVersion}, {"files", std::move(entries)}};
  write_atomically(root_ / "trees" / (commit + ".json"), j.dump(1));
}

// Two processes may link the same pointer at once (the blob's lock covers its download, not the
// link). The link is made under a name of its own and renamed over the pointer, which replaces
// whatever is there in one step: a remove followed by a create would let the other process's
// create land in between and fail this one with "File exists".
void RepoCache::link(const std::string& commit, const std::string& path,
                     const std::string& etag) const {
  fs::path link = pointer(commit, path);
  fs::path target = blob(etag);
  fs::create_directories(link.parent_path());
  fs::path tmp = link;
  tmp += "." + random_suffix() + ".tmp";
  std::error_code ec;
  fs::create_symlink(relative_link_target(link, target), tmp, ec);
  if (ec && ec != std::errc::operation_not_permitted && ec != std::errc::operation_not_supported) {
    throw std::runtime_error("cannot link " + link.string() + " to " + target.string() + ": " +
                             ec.message());
  }
  try {
    if (ec) fs::copy_file(target, tmp, fs::copy_options::overwrite_existing);
    fs::rename(tmp, link);
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
}

void RepoCache::tag_cache_dir() const {
  fs::path tag = cache_dir_ / "CACHEDIR.TAG";
  if (fs::exists(tag)) return;
  std::ofstream out(tag, std::ios::binary);
  out << "Signature: 8a477f597d28d172789f06886806bc55\n"
         "# This file is a cache directory tag created by huggingface_hub.\n"
         "# For information about cache directory tags, see:\n"
         "#\thttps://bford.info/cachedir/\n";
}

fs::path relative_link_target(const fs::path& link, const fs::path& target) {
  return target.lexically_relative(link.parent_path());
}

void ensure_free_space(const fs::path& dir, int64_t bytes, const std::string& what) {
  struct statvfs st {};
  if (statvfs(dir.c_str(), &st) != 0) return;  // unknown: let the writes tell
  auto avail = static_cast<unsigned long long>(st.f_bavail) * st.f_frsize;
  if (bytes > 0 && static_cast<unsigned long long>(bytes) > avail) {
    throw std::runtime_error("not enough disk space for " + what + ": it needs " +
                             std::to_string(bytes) + " bytes, and " + dir.string() + " has " +
                             std::to_string(avail) +
                             " free; free some space or point HF_HUB_CACHE elsewhere");
  }
}

FileLock::FileLock(const fs::path& path, const std::function<void()>& on_wait) {
  fs::create_directories(path.parent_path());
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0664);
  if (fd_ < 0) {
    throw std::runtime_error("cannot open lock file " + path.string() + ": " +
                             std::strerror(errno));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
  if (errno != EWOULDBLOCK) return;  // no flock on this file system: go on unlocked, as Python does
  if (on_wait) on_wait();
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno != EINTR) {
      int err = errno;
      ::close(fd_);
      throw std::runtime_error("cannot lock " + path.string() + ": " + std::strerror(err));
    }
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

}  // namespace torchtpu::hub
