// The Hub client's pieces that need no server: environment defaults, ids, the cache layout,
// globs, hashes, URLs, and the cache-only (offline) path of download(). Transfers are tested in
// tests/python/test_hub.py against a fake Hub.
#include "hub/hub.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/download_command.h"
#include "common/errors.h"
#include "hub/cache.h"
#include "hub/digest.h"
#include "hub/files.h"
#include "hub/http.h"

namespace fs = std::filesystem;
using namespace torchtpu;
using namespace torchtpu::hub;

namespace {

// Sets (or, with nullopt, unsets) environment variables for one test and restores them after.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, std::optional<std::string>>> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      if (value) {
        setenv(name, value->c_str(), 1);
      } else {
        unsetenv(name);
      }
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// All the variables Options::from_env reads, unset.
ScopedEnv clean_env() {
  return ScopedEnv({{"HF_ENDPOINT", std::nullopt},
                    {"HF_HOME", std::nullopt},
                    {"HF_HUB_CACHE", std::nullopt},
                    {"HUGGINGFACE_HUB_CACHE", std::nullopt},
                    {"XDG_CACHE_HOME", std::nullopt},
                    {"HF_TOKEN", std::nullopt},
                    {"HUGGING_FACE_HUB_TOKEN", std::nullopt},
                    {"HF_TOKEN_PATH", std::nullopt},
                    {"HF_HUB_DISABLE_IMPLICIT_TOKEN", std::nullopt},
                    {"HF_HUB_OFFLINE", std::nullopt},
                    {"TRANSFORMERS_OFFLINE", std::nullopt},
                    {"HF_HUB_DISABLE_PROGRESS_BARS", std::nullopt},
                    {"HOME", "/home/someone"}});
}

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("hub_test_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::string sha256_of(const std::string& s) {
  Digest d(DigestKind::kSha256, static_cast<int64_t>(s.size()));
  d.update(s.data(), s.size());
  return d.hex();
}

std::string git_sha1_of(const std::string& s) {
  Digest d(DigestKind::kGitBlobSha1, static_cast<int64_t>(s.size()));
  d.update(s.data(), s.size());
  return d.hex();
}

}  // namespace

TEST(HubOptions, DefaultsFollowHuggingFaceHub) {
  auto env = clean_env();
  Options o = Options::from_env();
  EXPECT_EQ(o.endpoint, "https://huggingface.co");
  EXPECT_EQ(o.cache_dir, "/home/someone/.cache/huggingface/hub");
  EXPECT_EQ(o.token, "");
  EXPECT_FALSE(o.offline);
  EXPECT_TRUE(o.progress);
}

TEST(HubOptions, CacheDirPrecedence) {
  auto env = clean_env();
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(Options::from_env().cache_dir, "/xdg/huggingface/hub");
  setenv("HF_HOME", "~/hf", 1);
  EXPECT_EQ(Options::from_env().cache_dir, "/home/someone/hf/hub");
  setenv("HUGGINGFACE_HUB_CACHE", "/legacy", 1);
  EXPECT_EQ(Options::from_env().cache_dir, "/legacy");
  setenv("HF_HUB_CACHE", "/new", 1);
  EXPECT_EQ(Options::from_env().cache_dir, "/new");
}

TEST(HubOptions, TokenFromEnvironmentThenTokenFile) {
  auto env = clean_env();
  fs::path home = temp_dir("token");
  setenv("HF_HOME", home.c_str(), 1);
  write(home / "token", "hf_from_file\n");
  EXPECT_EQ(Options::from_env().token, "hf_from_file");
  setenv("HUGGING_FACE_HUB_TOKEN", "hf_legacy", 1);
  EXPECT_EQ(Options::from_env().token, "hf_legacy");
  setenv("HF_TOKEN", " hf_new ", 1);
  EXPECT_EQ(Options::from_env().token, "hf_new");
  setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1", 1);
  EXPECT_EQ(Options::from_env().token, "");
  fs::remove_all(home);
}

TEST(HubOptions, EndpointOfflineAndProgressSwitches) {
  auto env = clean_env();
  setenv("HF_ENDPOINT", "http://mirror.example:8080/", 1);
  setenv("HF_HUB_OFFLINE", "yes", 1);
  setenv("HF_HUB_DISABLE_PROGRESS_BARS", "TRUE", 1);
  Options o = Options::from_env();
  EXPECT_EQ(o.endpoint, "http://mirror.example:8080");
  EXPECT_TRUE(o.offline);
  EXPECT_FALSE(o.progress);
  setenv("HF_HUB_OFFLINE", "0", 1);
  EXPECT_FALSE(Options::from_env().offline);
  setenv("TRANSFORMERS_OFFLINE", "1", 1);
  EXPECT_TRUE(Options::from_env().offline);
}

TEST(HubIds, RepoIdsAndLocalDirectories) {
  EXPECT_TRUE(looks_like_repo_id("google/gemma-4-E2B-it"));
  EXPECT_TRUE(looks_like_repo_id("xbill9/gemma-4-E2B-it-qat-q4_0-w4a16-ct-text@main"));
  EXPECT_TRUE(looks_like_repo_id("org/name@refs/pr/1"));
  EXPECT_FALSE(looks_like_repo_id("gpt2"));  // the engine's ids always have an org
  EXPECT_FALSE(looks_like_repo_id("org/name@"));
  EXPECT_FALSE(looks_like_repo_id("./models/x"));
  EXPECT_FALSE(looks_like_repo_id("/abs/path"));
  EXPECT_FALSE(looks_like_repo_id("org/../x"));
  EXPECT_FALSE(looks_like_repo_id("org/a--b"));
  EXPECT_FALSE(looks_like_repo_id("org/name/extra"));
  fs::path dir = temp_dir("ids");
  fs::create_directories(dir / "org" / "name");
  fs::path cwd = fs::current_path();
  fs::current_path(dir);
  EXPECT_FALSE(looks_like_repo_id("org/name"));  // an existing directory wins
  EXPECT_EQ(resolve_model("org/name", Options{}), "org/name");
  fs::current_path(cwd);
  fs::remove_all(dir);
}

TEST(HubIds, ResolveModelRejectsWhatIsNeitherDirNorId) {
  EXPECT_THROW(resolve_model("./no/such/dir", Options{}), NotFoundError);
}

TEST(HubIds, DownloadRejectsMalformedIdsAndRevisions) {
  Options o;
  o.cache_dir = "/nonexistent";
  o.offline = true;
  EXPECT_THROW(download("org/na me", "main", o), ValueError);
  EXPECT_THROW(download("org/name", "../../etc", o), ValueError);
  EXPECT_THROW(download("org/name", "/abs", o), ValueError);
}

TEST(HubCache, FolderNamesAndPaths) {
  EXPECT_EQ(repo_folder_name("google/gemma-4-E2B-it"), "models--google--gemma-4-E2B-it");
  EXPECT_EQ(repo_folder_name("gpt2"), "models--gpt2");
  RepoCache c("/c", "org/name");
  EXPECT_EQ(c.blob("abc"), fs::path("/c/models--org--name/blobs/abc"));
  EXPECT_EQ(c.pointer("c0", "sub/x.json"),
            fs::path("/c/models--org--name/snapshots/c0/sub/x.json"));
  EXPECT_EQ(c.lock_file("abc"), fs::path("/c/.locks/models--org--name/abc.lock"));
  EXPECT_THROW(c.pointer("c0", "../escape"), FormatError);
  EXPECT_THROW(c.pointer("c0", "/abs"), FormatError);
}

TEST(HubCache, SymlinksAreRelativeToTheBlob) {
  EXPECT_EQ(relative_link_target("/c/m/snapshots/c0/config.json", "/c/m/blobs/e"),
            fs::path("../../blobs/e"));
  EXPECT_EQ(relative_link_target("/c/m/snapshots/c0/a/b/x", "/c/m/blobs/e"),
            fs::path("../../../../blobs/e"));
}

TEST(HubCache, RefsTreesAndLinksRoundTrip) {
  fs::path dir = temp_dir("cache");
  RepoCache c(dir, "org/name");
  const std::string commit(40, 'a');
  EXPECT_EQ(c.read_ref("main"), "");
  c.write_ref("main", commit);
  c.write_ref("refs/pr/1", commit);
  EXPECT_EQ(c.read_ref("main"), commit);
  EXPECT_EQ(c.read_ref("refs/pr/1"), commit);
  write(dir / "models--org--name" / "refs" / "broken", "not a commit");
  EXPECT_EQ(c.read_ref("broken"), "");

  RepoFile git{"config.json", 3, std::string(40, 'b'), ""};
  RepoFile lfs{"sub/w.safetensors", 5, std::string(40, 'c'), std::string(64, 'd')};
  EXPECT_FALSE(c.read_tree(commit));
  c.write_tree(commit, {git, lfs});
  auto tree = c.read_tree(commit);
  ASSERT_TRUE(tree);
  ASSERT_EQ(tree->size(), 2u);
  EXPECT_EQ((*tree)[1].path, "sub/w.safetensors");
  EXPECT_EQ((*tree)[1].etag(), std::string(64, 'd'));
  EXPECT_EQ((*tree)[0].etag(), std::string(40, 'b'));
  auto json =
      nlohmann::json::parse(std::ifstream(dir / "models--org--name/trees" / (commit + ".json")));
  EXPECT_EQ(json["format_version"], 1);
  EXPECT_EQ(json["files"]["sub/w.safetensors"]["lfs_size"], 5);

  write(c.blob(lfs.etag()), "hello");
  c.link(commit, lfs.path, lfs.etag());
  fs::path ptr = c.pointer(commit, lfs.path);
  EXPECT_TRUE(fs::is_symlink(ptr));
  EXPECT_EQ(fs::read_symlink(ptr), fs::path("../../../blobs") / lfs.etag());
  EXPECT_EQ(fs::file_size(ptr), 5u);
  fs::remove_all(dir);
}

// Two downloads of one snapshot link the same pointers. Linking by remove-then-create failed the
// later one with "File exists" when the other's create fell in between (CI, test_hub.py's
// concurrent downloads); threads linking one pointer at once, many times, force that ordering.
TEST(HubCache, ConcurrentLinksOfOnePointerAllSucceed) {
  fs::path dir = temp_dir("cache-race");
  RepoCache c(dir, "org/name");
  const std::string commit(40, 'a');
  RepoFile f{"config.json", 5, std::string(40, 'b'), ""};
  write(c.blob(f.etag()), "hello");
  constexpr int kThreads = 4;
  constexpr int kRounds = 500;
  std::atomic<int> failures{0};
  std::string first_error;
  std::mutex error_mutex;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        try {
          c.link(commit, f.path, f.etag());
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (failures++ == 0) first_error = e.what();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0) << first_error;
  fs::path ptr = c.pointer(commit, f.path);
  EXPECT_TRUE(fs::is_symlink(ptr));
  EXPECT_EQ(fs::file_size(ptr), 5u);
  std::vector<fs::path> left;
  for (const auto& e : fs::directory_iterator(ptr.parent_path())) left.push_back(e.path());
  EXPECT_EQ(left, std::vector<fs::path>{ptr}) << "a temporary link was left behind";
  fs::remove_all(dir);
}

TEST(HubCache, FreeSpaceCheckNamesTheShortfall) {
  fs::path dir = temp_dir("space");
  EXPECT_NO_THROW(ensure_free_space(dir, 1, "x"));
  try {
    ensure_free_space(dir, int64_t{1} << 62, "model.safetensors");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not enough disk space for model.safetensors"),
              std::string::npos);
  }
  fs::remove_all(dir);
}

// Expected values are Python's fnmatch.fnmatchcase, which huggingface_hub's allow_patterns use.
TEST(HubFiles, GlobsMatchLikePythonFnmatch) {
  EXPECT_TRUE(glob_matches("*.json", "config.json"));
  EXPECT_TRUE(glob_matches("*.json", "sub/config.json"));  // '*' crosses '/'
  EXPECT_TRUE(glob_matches("*", ".gitattributes"));        // and matches a leading dot
  EXPECT_TRUE(glob_matches("model-0000[12]-*", "model-00002-of-00002.safetensors"));
  EXPECT_TRUE(glob_matches("model-0000[!1]-*", "model-00002-of-00002.safetensors"));
  EXPECT_FALSE(glob_matches("*.JSON", "config.json"));
  EXPECT_TRUE(glob_matches("onnx/", "onnx/model.onnx"));  // a folder pattern
  EXPECT_FALSE(glob_matches("config.json", "sub/config.json"));
}

TEST(HubFiles, EngineFilesAreTheTopLevelModelAndAdapterFiles) {
  for (const char* f : {"config.json", "generation_config.json", "chat_template.jinja",
                        "tokenizer.json", "tokenizer_config.json", "model.safetensors",
                        "model-00001-of-00002.safetensors", "model.safetensors.index.json",
                        "adapter_config.json", "adapter_model.safetensors"}) {
    EXPECT_TRUE(is_engine_file(f)) << f;
  }
  for (const char* f : {"README.md", ".gitattributes", "original/model.safetensors",
                        "pytorch_model.bin", "model.onnx", "tokenizer.model",
                        "adapter_model.bin"}) {
    EXPECT_FALSE(is_engine_file(f)) << f;
  }
  std::vector<RepoFile> files = {{"config.json"}, {"a.safetensors"}, {"README.md"}};
  EXPECT_EQ(select_files(files, {}).size(), 2u);
  auto only = select_files(files, {"*.json", "README.md"});
  ASSERT_EQ(only.size(), 1u);
  EXPECT_EQ(only[0].path, "config.json");
}

TEST(HubFiles, ModelInfoWithBlobs) {
  auto info = nlohmann::json::parse(R"({
    "id": "org/name", "sha": "0123456789abcdef0123456789abcdef01234567",
    "siblings": [
      {"rfilename": "config.json", "size": 10, "blobId": "1111111111111111111111111111111111111111"},
      {"rfilename": "model.safetensors", "size": 134, "blobId": "2222222222222222222222222222222222222222",
       "lfs": {"sha256": "3333333333333333333333333333333333333333333333333333333333333333",
               "size": 99999, "pointerSize": 134}}]})");
  bool complete = false;
  Listing l = parse_model_info(info, "reply", &complete);
  EXPECT_TRUE(complete);
  EXPECT_EQ(l.commit, "0123456789abcdef0123456789abcdef01234567");
  ASSERT_EQ(l.files.size(), 2u);
  EXPECT_EQ(l.files[0].etag(), std::string(40, '1'));
  EXPECT_EQ(l.files[1].etag(), std::string(64, '3'));
  EXPECT_EQ(l.files[1].size, 99999);

  info["siblings"] = nlohmann::json::parse(R"([{"rfilename": "config.json"}])");
  parse_model_info(info, "reply", &complete);
  EXPECT_FALSE(complete);

  info["siblings"] = nlohmann::json::parse(
      R"([{"rfilename": "config.json", "size": 1, "blobId": "../../etc/passwd"}])");
  EXPECT_THROW(parse_model_info(info, "reply", &complete), FormatError);
  info["sha"] = "main";
  EXPECT_THROW(parse_model_info(info, "reply", &complete), FormatError);
}

TEST(HubFiles, TreePageSkipsFolders) {
  auto page = nlohmann::json::parse(R"([
    {"type": "directory", "oid": "0000000000000000000000000000000000000000", "size": 0, "path": "sub"},
    {"type": "file", "oid": "1111111111111111111111111111111111111111", "size": 134, "path": "sub/w.safetensors",
     "lfs": {"oid": "3333333333333333333333333333333333333333333333333333333333333333", "size": 7, "pointerSize": 134}}])");
  auto files = parse_tree_page(page, "page");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].path, "sub/w.safetensors");
  EXPECT_EQ(files[0].size, 7);
  EXPECT_EQ(files[0].etag(), std::string(64, '3'));
}

// Reference values: FIPS 180-2's "abc" example, and `git hash-object` of the same contents.
TEST(HubDigest, Sha256AndGitBlobSha1) {
  EXPECT_EQ(sha256_of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(git_sha1_of(""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
  EXPECT_EQ(git_sha1_of("hello\n"), "ce013625030ba8dba906f756967f9e9ca394464a");
  fs::path dir = temp_dir("digest");
  write(dir / "f", "abcdef");
  Digest d(DigestKind::kSha256, 3);
  update_from_file(d, (dir / "f").string(), 3);
  EXPECT_EQ(d.hex(), sha256_of("abc"));
  fs::remove_all(dir);
}

TEST(HubHttp, OriginsQuotingAndRedirectTargets) {
  EXPECT_EQ(url_origin("https://HuggingFace.co/a/b"), "https://huggingface.co:443");
  EXPECT_EQ(url_origin("http://127.0.0.1:8000/x"), url_origin("http://127.0.0.1:8000/y?z"));
  EXPECT_NE(url_origin("http://127.0.0.1:8000/x"), url_origin("http://localhost:8000/x"));
  EXPECT_NE(url_origin("http://127.0.0.1:8000/x"), url_origin("http://127.0.0.1:8001/x"));
  EXPECT_NE(url_origin("http://h/x"), url_origin("https://h/x"));
  EXPECT_EQ(resolve_url("http://h:1/a/b?q", "/c/d"), "http://h:1/c/d");
  EXPECT_EQ(resolve_url("http://h:1/a/b", "https://cdn/x?sig=1"), "https://cdn/x?sig=1");
  // As Python's quote(rev, safe="") and quote(path) in huggingface_hub's URLs.
  EXPECT_EQ(url_quote("refs/pr/1", false), "refs%2Fpr%2F1");
  EXPECT_EQ(url_quote("sub dir/a+b.json", true), "sub%20dir/a%2Bb.json");
}

// Only http and https are spoken: another scheme is refused before anything is opened or sent
// (js_media checks a redirect to one, through a real server).
TEST(HubHttp, OtherSchemesAreRefusedUnopened) {
  HttpClient http("torchtpu-cpp-test", "");
  for (const char* url : {"file:///etc/hostname", "gopher://127.0.0.1:9/_x", "ftp://127.0.0.1/"}) {
    try {
      http.get(url);
      ADD_FAILURE() << url << " was fetched";
    } catch (const TransportError& e) {
      EXPECT_EQ(std::string(e.what()), std::string(url) + " is not an http(s) URL");
    }
  }
}

TEST(HubOffline, ServesACompleteCachedSnapshotWithoutNetwork) {
  fs::path dir = temp_dir("offline");
  const std::string commit(40, 'e');
  RepoCache c(dir, "org/name");
  c.write_ref("main", commit);
  RepoFile config{"config.json", 2, git_sha1_of("{}"), ""};
  RepoFile weights{"model.safetensors", 3, git_sha1_of("ptr"), sha256_of("abc")};
  RepoFile readme{"README.md", 1, git_sha1_of("x"), ""};
  c.write_tree(commit, {config, weights, readme});
  write(c.blob(config.etag()), "{}");
  c.link(commit, config.path, config.etag());

  Options o;
  o.cache_dir = dir.string();
  o.endpoint = "http://127.0.0.1:9";
  o.offline = true;
  o.progress = false;
  try {
    download("org/name", "main", o);
    FAIL() << "expected NotFoundError";
  } catch (const NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find("HF_HUB_OFFLINE"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("lacks model.safetensors"), std::string::npos);
  }
  // A download cut short (a truncated blob) is there, but not whole: named so.
  write(c.blob(weights.etag()), "ab");
  c.link(commit, weights.path, weights.etag());
  try {
    download("org/name", "main", o);
    FAIL() << "expected NotFoundError";
  } catch (const NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find("holds model.safetensors (2 of 3 bytes) cut short"),
              std::string::npos)
        << e.what();
  }
  write(c.blob(weights.etag()), "abc");
  c.link(commit, weights.path, weights.etag());
  EXPECT_EQ(fs::path(download("org/name", "main", o)), c.snapshot(commit));
  EXPECT_EQ(fs::path(resolve_model("org/name@main", o)), c.snapshot(commit));
  EXPECT_EQ(fs::path(download("org/name", commit, o)), c.snapshot(commit));
  EXPECT_THROW(download("org/name", "v2", o), NotFoundError);
  EXPECT_THROW(download("org/other", "main", o), NotFoundError);
  fs::remove_all(dir);
}

namespace {

// Runs `args` through a fresh app holding only the download command.
void parse_download(std::vector<std::string> args) {
  CLI::App app;
  add_download_command(app);
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last first
  app.parse(args);
}

}  // namespace

TEST(HubCli, DownloadCommandPassesIdRevisionAndIncludes) {
  // Offline, against a cached snapshot of v1 that holds config.json but not the weights.
  auto env = ScopedEnv({{"HF_HUB_OFFLINE", "1"}});
  fs::path dir = temp_dir("cli");
  const std::string commit(40, 'f');
  RepoCache c(dir, "org/name");
  c.write_ref("v1", commit);
  RepoFile config{"config.json", 2, git_sha1_of("{}"), ""};
  RepoFile weights{"model.safetensors", 3, git_sha1_of("ptr"), sha256_of("abc")};
  c.write_tree(commit, {config, weights});
  write(c.blob(config.etag()), "{}");
  c.link(commit, config.path, config.etag());
  const std::string cache = "--cache-dir=" + dir.string();

  EXPECT_NO_THROW(parse_download({"download", "--include", "*.json", "org/name@v1", cache}));
  EXPECT_NO_THROW(parse_download({"download", "org/name", "--revision", "v1", "--include",
                                  "config.json", "--include", "*.jinja", cache, "--quiet"}));
  EXPECT_THROW(parse_download({"download", "org/name@v1", cache}), NotFoundError);
  EXPECT_THROW(parse_download({"download", "org/name", cache}), NotFoundError);
  EXPECT_THROW(parse_download({"download", "org/name@v1", "--revision", "v2", cache}), ValueError);
  EXPECT_THROW(parse_download({"download"}), CLI::RequiredError);
  fs::remove_all(dir);
}
