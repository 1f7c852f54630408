#include "server/web/web.h"

#include <string>

namespace torchtpu::server {
namespace {

std::string content_type(std::string_view name) {
  if (name.ends_with(".html")) return "text/html; charset=utf-8";
  if (name.ends_with(".css")) return "text/css; charset=utf-8";
  if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
  return "application/octet-stream";
}

const WebAsset* find_asset(std::string_view name) {
  size_t count = 0;
  const WebAsset* assets = web_assets(&count);
  for (size_t i = 0; i < count; ++i) {
    if (assets[i].name == name) return &assets[i];
  }
  return nullptr;
}

void send_asset(const WebAsset& asset, httplib::Response& res) {
  res.set_content(std::string(asset.content), content_type(asset.name));
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Content-Type-Options", "nosniff");
  // The page talks only to its own origin and runs only its own script. Attached images and audio
  // are shown as <img> and <audio> of their data: URLs, so img-src and media-src allow data:.
  res.set_header("Content-Security-Policy",
                 "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                 "media-src 'self' data:; object-src 'none'; base-uri 'none'; "
                 "frame-ancestors 'none'");
}

}  // namespace

void add_web_routes(httplib::Server& http) {
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    send_asset(*find_asset("index.html"), res);
  });
  http.Get(R"(/web/([A-Za-z0-9_.-]+))", [](const httplib::Request& req, httplib::Response& res) {
    const WebAsset* asset = find_asset(req.matches[1].str());
    // No body: the server's error handler writes its usual 404.
    if (asset == nullptr) {
      res.status = 404;
      return;
    }
    send_asset(*asset, res);
  });
}

}  // namespace torchtpu::server
