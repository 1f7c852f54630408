#include "hub/hub.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "build_info.h"
#include "common/errors.h"
#include "common/json_type.h"
#include "hub/cache.h"
#include "hub/digest.h"
#include "hub/files.h"
#include "hub/http.h"
#include "hub/progress.h"

namespace torchtpu::hub {
namespace fs = std::filesystem;
namespace {

constexpr const char* kDefaultEndpoint = "https://huggingface.co";
// Broken transfers in a row (one that moved bytes counts as the first of a new run) before a
// download gives up for this run; its partial file stays for the next.
constexpr int kMaxBrokenTransfers = 4;
constexpr auto kFirstBackoff = std::chrono::milliseconds(250);
// A download whose hash differs from the listing is fetched once more before that is an error.
constexpr int kMaxHashMismatches = 2;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// huggingface_hub's _is_true: "1", "ON", "YES", "TRUE" in any case.
bool env_true(const char* name) {
  std::string v = env(name);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::toupper(c); });
  return v == "1" || v == "ON" || v == "YES" || v == "TRUE";
}

std::string home_dir() {
  std::string home = env("HOME");
  if (!home.empty()) return home;
  const passwd* pw = getpwuid(getuid());
  return pw != nullptr && pw->pw_dir != nullptr ? pw->pw_dir : "/";
}

std::string expand_home(const std::string& p) {
  if (p == "~") return home_dir();
  if (p.rfind("~/", 0) == 0) return home_dir() + p.substr(1);
  return p;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// huggingface_hub's validate_repo_id: "name" or "org/name" of [A-Za-z0-9_.-], starting and
// ending with a word character, without "--" or "..", at most 96 characters.
bool valid_repo_id(const std::string& id) {
  if (id.empty() || id.size() > 96 || id.find("--") != std::string::npos ||
      id.find("..") != std::string::npos) {
    return false;
  }
  size_t slash = id.find('/');
  std::vector<std::string> parts = {id.substr(0, slash)};
  if (slash != std::string::npos) parts.push_back(id.substr(slash + 1));
  for (const auto& p : parts) {
    if (p.empty() || !is_word_char(p.front()) || !is_word_char(p.back())) return false;
    for (char c : p) {
      if (!is_word_char(c) && c != '-' && c != '.') return false;
    }
  }
  return true;
}

void check_revision(const std::string& rev) {
  fs::path p(rev);
  bool bad = rev.empty() || p.is_absolute() || rev.back() == '/';
  for (const auto& part : p) {
    if (part == ".." || part == "." || part.empty()) bad = true;
  }
  if (bad) throw ValueError("invalid revision '" + rev + "': expected a branch, tag or commit");
}

bool file_has_size(const fs::path& p, int64_t size) {
  std::error_code ec;
  auto n = fs::file_size(p, ec);
  return !ec && static_cast<int64_t>(n) == size;
}

std::string join(const std::vector<std::string>& items, size_t limit = 5) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < limit; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > limit) out += ", ... (" + std::to_string(items.size() - limit) + " more)";
  return out;
}

// A reply that is not a success, with what the Hub said about it (X-Error-Code and
// X-Error-Message are how the Hub names the cause).
struct ReplyError : std::runtime_error {
  explicit ReplyError(const HttpResponse& r)
      : std::runtime_error("HTTP " + std::to_string(r.status) + " from " + r.url),
        status(r.status),
        code(r.header("x-error-code")),
        message(r.header("x-error-message")),
        url(r.url) {
    if (message.empty()) message = trim(r.body.substr(0, 300));
  }
  long status;
  std::string code, message, url;
};

[[noreturn]] void throw_for_reply(const ReplyError& e, const std::string& repo_id,
                                  const std::string& revision, const Options& opts) {
  const std::string page = opts.endpoint + "/" + repo_id;
  const std::string http = "HTTP " + std::to_string(e.status);
  const std::string said = e.message.empty() ? "" : " (the Hub says: " + e.message + ")";
  if (e.code == "RevisionNotFound") {
    throw NotFoundError("revision '" + revision + "' not found in " + repo_id + " at " +
                        opts.endpoint + " (" + http + "): check the branch, tag or commit");
  }
  if (e.code == "GatedRepo" || ((e.status == 401 || e.status == 403) && e.code.empty())) {
    if (opts.token.empty()) {
      throw UpstreamError(
          repo_id + " is gated or private and no token was sent (" + http + ")" + said +
          ": set HF_TOKEN to a token of an account that has accepted the model's licence at " +
          page);
    }
    throw UpstreamError("access to " + repo_id + " was refused with the token in use (" + http +
                        ")" + said + ": accept the model's licence at " + page +
                        " with the account the token belongs to, and check that HF_TOKEN "
                        "grants read access");
  }
  if (e.code == "RepoNotFound" || e.status == 404 || e.status == 401) {
    std::string hint = opts.token.empty()
                           ? "; if it is private or gated, set HF_TOKEN and accept its licence"
                           : "; check the id and that HF_TOKEN grants access to it";
    throw NotFoundError("repository '" + repo_id + "' not found at " + opts.endpoint + " (" + http +
                        ")" + hint);
  }
  throw UpstreamError("the Hub at " + opts.endpoint + " answered " + http + " for " + e.url + said);
}

nlohmann::json parse_json(const HttpResponse& r) {
  try {
    return nlohmann::json::parse(r.body);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError("the reply from " + r.url + " is not JSON (" + json_error_text(e) +
                      "); does HF_ENDPOINT point at a Hugging Face Hub?");
  }
}

// The "next" URL of a Link header (the Hub's cursor pagination), or "".
std::string next_page(const HttpResponse& r) {
  std::string link = r.header("link");
  size_t pos = 0;
  while ((pos = link.find('<', pos)) != std::string::npos) {
    size_t close = link.find('>', pos);
    if (close == std::string::npos) break;
    size_t next = link.find('<', close);
    std::string params =
        link.substr(close + 1, next == std::string::npos ? std::string::npos : next - close - 1);
    if (params.find("rel=\"next\"") != std::string::npos) {
      return resolve_url(r.url, link.substr(pos + 1, close - pos - 1));
    }
    pos = close;
  }
  return "";
}

// The repo's files at `rev`: from the tree cache when `rev` is a commit already listed there,
// else from the revision API with blobs=true, else (a server that ignores blobs=true) from the
// paginated tree API.
Listing fetch_listing(HttpClient& http, const Options& opts, const std::string& repo_id,
                      const std::string& rev, const RepoCache& cache) {
  if (is_commit_hash(rev)) {
    if (auto files = cache.read_tree(rev)) return {rev, *files};
  }
  const std::string api = opts.endpoint + "/api/models/" + repo_id;
  HttpResponse r = http.get(api + "/revision/" + url_quote(rev, false) + "?blobs=true");
  if (r.status != 200) throw ReplyError(r);
  bool complete = false;
  Listing listing = parse_model_info(parse_json(r), r.url, &complete);
  if (complete) return listing;
  if (auto files = cache.read_tree(listing.commit)) return {listing.commit, *files};
  listing.files.clear();
  std::string url = api + "/tree/" + listing.commit + "?recursive=true";
  while (!url.empty()) {
    r = http.get(url);
    if (r.status != 200) throw ReplyError(r);
    auto page = parse_tree_page(parse_json(r), r.url);
    listing.files.insert(listing.files.end(), page.begin(), page.end());
    url = next_page(r);
  }
  return listing;
}

// The cached snapshot of `rev` if it holds every file the engine needs, else nullopt with the
// reason in `why_not`.
std::optional<std::string> cached_snapshot(const RepoCache& cache, const std::string& repo_id,
                                           const std::string& rev,
                                           const std::vector<std::string>& include,
                                           std::string* why_not) {
  std::string commit = is_commit_hash(rev) ? rev : cache.read_ref(rev);
  fs::path snap = commit.empty() ? fs::path() : cache.snapshot(commit);
  if (commit.empty() || !fs::is_directory(snap)) {
    *why_not = "nothing of " + repo_id + " at revision '" + rev + "' is cached in " +
               cache.root().parent_path().string();
    return std::nullopt;
  }
  std::vector<std::string> missing;
  // There, but not of the size the listing gives: a download cut short.
  std::vector<std::string> short_files;
  std::vector<RepoFile> wanted;
  if (auto tree = cache.read_tree(commit)) {
    wanted = select_files(*tree, include);
    for (const auto& f : wanted) {
      std::error_code ec;
      const auto size = fs::file_size(cache.pointer(commit, f.path), ec);
      if (ec) {
        missing.push_back(f.path);
      } else if (static_cast<int64_t>(size) != f.size) {
        short_files.push_back(f.path + " (" + std::to_string(size) + " of " +
                              std::to_string(f.size) + " bytes)");
      }
    }
  } else {
    // No listing was cached (files fetched one by one): judge by what the snapshot holds, and
    // by the shards its safetensors index names.
    std::vector<RepoFile> present;
    for (const auto& e : fs::recursive_directory_iterator(snap)) {
      if (!fs::is_regular_file(e.path())) continue;
      RepoFile f;
      f.path = e.path().lexically_relative(snap).generic_string();
      present.push_back(std::move(f));
    }
    wanted = select_files(present, include);
    for (const auto& f : wanted) {
      if (f.path.size() < 5 || f.path.substr(f.path.size() - 5) != ".json" ||
          f.path.find(".safetensors.index") == std::string::npos) {
        continue;
      }
      try {
        auto index = nlohmann::json::parse(std::ifstream(snap / f.path));
        for (const auto& [tensor, shard] : index.at("weight_map").items()) {
          std::string s = shard.get<std::string>();
          if (!fs::exists(snap / s) &&
              std::find(missing.begin(), missing.end(), s) == missing.end()) {
            missing.push_back(s);
          }
        }
      } catch (const nlohmann::json::exception& e) {
        throw FormatError((snap / f.path).string() +
                          ": unreadable safetensors index: " + json_error_text(e));
      }
    }
  }
  if (wanted.empty()) {
    *why_not = "the cached snapshot " + snap.string() + " holds none of the files asked for";
    return std::nullopt;
  }
  if (!missing.empty() || !short_files.empty()) {
    *why_not = "the cached snapshot " + snap.string() +
               (missing.empty() ? "" : " lacks " + join(missing)) +
               (missing.empty() || short_files.empty() ? "" : " and") +
               (short_files.empty() ? "" : " holds " + join(short_files) + " cut short");
    return std::nullopt;
  }
  return snap.string();
}

void write_all(int fd, const char* data, size_t n, const fs::path& part, const RepoFile& f,
               int64_t have) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      int err = errno;
      if (err == ENOSPC || err == EDQUOT) {
        throw std::runtime_error("disk full while writing " + part.string() + " (" +
                                 std::to_string(have) + " of " + std::to_string(f.size) +
                                 " bytes of " + f.path +
                                 "): free space there or point "
                                 "HF_HUB_CACHE elsewhere; the next run resumes from this file");
      }
      throw std::runtime_error("cannot write " + part.string() + ": " + std::strerror(err));
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

// Offset where a 206 reply's body starts ("bytes 100-999/1000"), or -1.
int64_t content_range_start(const std::string& header) {
  size_t sp = header.find(' ');
  if (header.rfind("bytes", 0) != 0 || sp == std::string::npos) return -1;
  return std::atoll(header.c_str() + sp + 1);
}

struct FileDescriptor {
  explicit FileDescriptor(int fd) : fd(fd) {}
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int fd;
};

struct Download {
  HttpClient& http;
  const Options& opts;
  const std::string& repo_id;
  const std::string& commit;
  const RepoFile& file;
  Progress& progress;

  // Brings blobs/<etag>.incomplete up to the file's full size, continuing what is there, and
  // returns the digest of its content.
  std::string fetch(const fs::path& part) {
    const std::string url =
        opts.endpoint + "/" + repo_id + "/resolve/" + commit + "/" + url_quote(file.path, true);
    const DigestKind kind =
        file.lfs_sha256.empty() ? DigestKind::kGitBlobSha1 : DigestKind::kSha256;
    std::error_code ec;
    auto on_disk = fs::file_size(part, ec);
    int64_t have = ec ? 0 : static_cast<int64_t>(on_disk);
    if (have > file.size) {
      fs::remove(part);
      have = 0;
    }
    ensure_free_space(part.parent_path(), file.size - have, file.path);
    const FileDescriptor out(::open(part.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666));
    if (out.fd < 0) {
      throw std::runtime_error("cannot open " + part.string() + ": " + std::strerror(errno));
    }
    const int fd = out.fd;
    auto digest = std::make_unique<Digest>(kind, file.size);
    if (have > 0) update_from_file(*digest, part.string(), have);

    progress.start(file.path, file.size, have);
    int broken = 0;
    std::string last_error;
    while (have < file.size) {
      const int64_t before = have;
      try {
        HttpResponse r = http.stream(
            url, have,
            [&](const HttpResponse& reply) {
              if (have == 0 && reply.status == 200) return;
              if (reply.status == 206 &&
                  content_range_start(reply.header("content-range")) == have) {
                return;
              }
              // The server ignored the Range (or answered another one): start over.
              if (::ftruncate(fd, 0) != 0) {
                throw std::runtime_error("cannot truncate " + part.string() + ": " +
                                         std::strerror(errno));
              }
              have = 0;
              digest = std::make_unique<Digest>(kind, file.size);
              progress.reset(0);
            },
            [&](const char* data, size_t n) {
              if (have + static_cast<int64_t>(n) > file.size) {
                throw FormatError(file.path + ": the server sent more than the " +
                                  std::to_string(file.size) + " bytes the Hub lists");
              }
              write_all(fd, data, n, part, file, have);
              digest->update(data, n);
              have += static_cast<int64_t>(n);
              progress.add(static_cast<int64_t>(n));
            });
        if (r.status == 416 || r.status == 429 || r.status >= 500) {
          last_error = "HTTP " + std::to_string(r.status) + " from " + r.url;
          if (r.status == 416) {  // the partial file no longer fits what the server holds
            if (::ftruncate(fd, 0) != 0) {
              throw std::runtime_error("cannot truncate " + part.string() + ": " +
                                       std::strerror(errno));
            }
            have = 0;
            digest = std::make_unique<Digest>(kind, file.size);
          }
        } else if (r.status / 100 != 2) {
          ReplyError e(r);
          if (e.code == "EntryNotFound" || (r.status == 404 && e.code.empty())) {
            throw NotFoundError(file.path + " is listed in " + repo_id + " at commit " + commit +
                                " but " + r.url + " answered HTTP 404");
          }
          throw_for_reply(e, repo_id, commit, opts);
        } else if (have < file.size) {
          last_error = "the reply ended early";
        }
      } catch (const TransportError& e) {
        last_error = e.what();
      }
      if (have >= file.size) break;
      broken = have > before ? 1 : broken + 1;
      if (broken >= kMaxBrokenTransfers) {
        throw UpstreamError("the download of " + file.path + " was interrupted at " +
                            std::to_string(have) + " of " + std::to_string(file.size) + " bytes (" +
                            last_error + "); the partial file " + part.string() +
                            " is kept and the next run resumes from there");
      }
      progress.note("retrying " + file.path + " from byte " + std::to_string(have) +
                    " after: " + last_error);
      std::this_thread::sleep_for(kFirstBackoff * (1 << (broken - 1)));
    }
    progress.finish();
    return digest->hex();
  }

  // Makes blobs/<etag> hold the file, checked against its hash: a blob already there (from an
  // earlier commit, or from Python) is verified, and replaced if damaged. Returns whether
  // anything was downloaded.
  bool to_blob(const RepoCache& cache) {
    const fs::path blob = cache.blob(file.etag());
    fs::create_directories(blob.parent_path());
    FileLock lock(cache.lock_file(file.etag()),
                  [&] { progress.note("waiting for another process downloading " + file.path); });
    const DigestKind kind =
        file.lfs_sha256.empty() ? DigestKind::kGitBlobSha1 : DigestKind::kSha256;
    const char* kind_name = file.lfs_sha256.empty() ? "git blob sha1" : "sha256";
    if (file_has_size(blob, file.size)) {
      Digest d(kind, file.size);
      update_from_file(d, blob.string(), file.size);
      if (d.hex() == file.etag()) return false;
      progress.note("warning: the cached " + blob.string() + " (" + file.path + ") does not " +
                    "match its " + kind_name + "; downloading it again");
      fs::remove(blob);
    }
    fs::path part = blob;
    part += ".incomplete";
    for (int attempt = 1;; ++attempt) {
      std::string got = fetch(part);
      if (got == file.etag()) break;
      fs::remove(part);
      std::string what = file.path + ": the downloaded content has " + kind_name + " " + got +
                         " but the Hub lists " + file.etag();
      if (attempt >= kMaxHashMismatches) {
        throw FormatError(what +
                          "; nothing was stored. The copy on the server or a proxy on the "
                          "way is damaged; try again later");
      }
      progress.note("warning: " + what + "; downloading it again");
    }
    fs::rename(part, blob);
    return true;
  }
};

std::string user_agent() {
  return std::string("torchtpu-cpp/") + TORCHTPU_VERSION + " libcurl/" +
         curl_version_info(CURLVERSION_NOW)->version;
}

}  // namespace

Options Options::from_env() {
  Options o;
  o.endpoint = env("HF_ENDPOINT");
  if (o.endpoint.empty()) o.endpoint = kDefaultEndpoint;
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();

  std::string hf_home = expand_home(env("HF_HOME"));
  if (hf_home.empty()) {
    std::string xdg = expand_home(env("XDG_CACHE_HOME"));
    hf_home = (fs::path(xdg.empty() ? home_dir() + "/.cache" : xdg) / "huggingface").string();
  }
  o.cache_dir = expand_home(env("HF_HUB_CACHE"));
  if (o.cache_dir.empty()) o.cache_dir = expand_home(env("HUGGINGFACE_HUB_CACHE"));
  if (o.cache_dir.empty()) o.cache_dir = (fs::path(hf_home) / "hub").string();

  if (!env_true("HF_HUB_DISABLE_IMPLICIT_TOKEN")) {
    o.token = trim(env("HF_TOKEN"));
    if (o.token.empty()) o.token = trim(env("HUGGING_FACE_HUB_TOKEN"));
    if (o.token.empty()) {
      std::string path = expand_home(env("HF_TOKEN_PATH"));
      if (path.empty()) path = (fs::path(hf_home) / "token").string();
      std::ifstream in(path);
      std::stringstream ss;
      ss << in.rdbuf();
      o.token = trim(ss.str());
    }
  }
  o.offline = env_true("HF_HUB_OFFLINE") || env_true("TRANSFORMERS_OFFLINE");
  o.progress = !env_true("HF_HUB_DISABLE_PROGRESS_BARS");
  return o;
}

bool looks_like_repo_id(const std::string& s) {
  std::error_code ec;
  if (s.empty() || fs::is_directory(s, ec)) return false;
  size_t at = s.find('@');
  if (at != std::string::npos && at + 1 == s.size()) return false;
  std::string id = s.substr(0, at);
  return id.find('/') != std::string::npos && valid_repo_id(id);
}

std::string download(const std::string& repo_id, const std::string& revision, const Options& opts,
                     const std::vector<std::string>& include) {
  if (!valid_repo_id(repo_id)) {
    throw ValueError("invalid Hub model id '" + repo_id +
                     "': expected org/name of letters, digits, '-', '_' and '.'");
  }
  const std::string rev = revision.empty() ? "main" : revision;
  check_revision(rev);
  if (opts.cache_dir.empty()) throw ValueError("no cache directory given (Options::cache_dir)");
  const RepoCache cache(fs::absolute(expand_home(opts.cache_dir)), repo_id);
  Progress progress(opts.progress);

  std::string why_not;
  if (opts.offline) {
    if (auto snap = cached_snapshot(cache, repo_id, rev, include, &why_not)) return *snap;
    throw NotFoundError("offline mode (HF_HUB_OFFLINE) is on and " + why_not +
                        ": download it once with network access");
  }

  HttpClient http(user_agent(), opts.token);
  Listing listing;
  try {
    listing = fetch_listing(http, opts, repo_id, rev, cache);
  } catch (const TransportError& e) {
    if (auto snap = cached_snapshot(cache, repo_id, rev, include, &why_not)) {
      progress.note(std::string("warning: cannot reach the Hub (") + e.what() +
                    "); using the cached snapshot " + *snap);
      return *snap;
    }
    throw UpstreamError("cannot reach the Hub at " + opts.endpoint + " (" + e.what() + ") and " +
                        why_not);
  } catch (const ReplyError& e) {
    if (e.code != "RevisionNotFound") {
      if (auto snap = cached_snapshot(cache, repo_id, rev, include, &why_not)) {
        progress.note("warning: the Hub refused to list " + repo_id + " (" + e.what() +
                      "); using the cached snapshot " + *snap);
        return *snap;
      }
    }
    throw_for_reply(e, repo_id, rev, opts);
  }

  cache.tag_cache_dir();
  cache.write_ref(rev, listing.commit);
  if (!cache.read_tree(listing.commit)) cache.write_tree(listing.commit, listing.files);
  std::vector<RepoFile> wanted = select_files(listing.files, include);
  if (wanted.empty()) {
    std::vector<std::string> names;
    for (const auto& f : listing.files) names.push_back(f.path);
    throw NotFoundError(repo_id + " at " + rev + " has none of the files the engine reads" +
                        (include.empty() ? "" : " that match --include " + join(include)) +
                        "; it holds: " + join(names, 20));
  }

  int64_t fetched = 0;
  size_t fetched_files = 0;
  for (const auto& f : wanted) {
    if (file_has_size(cache.pointer(listing.commit, f.path), f.size)) continue;
    if (Download{http, opts, repo_id, listing.commit, f, progress}.to_blob(cache)) {
      fetched += f.size;
      ++fetched_files;
    }
    cache.link(listing.commit, f.path, f.etag());
  }
  if (opts.progress && fetched_files > 0) {
    progress.note(std::to_string(fetched_files) + " of " + std::to_string(wanted.size()) +
                  " files downloaded (" + human_bytes(static_cast<double>(fetched)) + ") into " +
                  cache.snapshot(listing.commit).string());
  }
  return cache.snapshot(listing.commit).string();
}

std::string resolve_model(const std::string& dir_or_id, const Options& opts) {
  std::error_code ec;
  if (fs::is_directory(dir_or_id, ec)) return dir_or_id;
  if (!looks_like_repo_id(dir_or_id)) {
    throw NotFoundError("'" + dir_or_id +
                        "' is neither a local directory nor a Hub model id (org/name or "
                        "org/name@revision)");
  }
  size_t at = dir_or_id.find('@');
  return download(dir_or_id.substr(0, at), at == std::string::npos ? "" : dir_or_id.substr(at + 1),
                  opts);
}

std::string resolve_if_repo_id(const std::string& path, const Options& opts) {
  return looks_like_repo_id(path) ? resolve_model(path, opts) : path;
}

}  // namespace torchtpu::hub
