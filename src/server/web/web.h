// The chat page (index.html, chat.css, chat.js beside this file), compiled into the binary by
// web.cmake so the server and the proxy serve it with no files and no network.
#pragma once

#include <httplib.h>

#include <string_view>

namespace torchtpu::server {

// One embedded file, by its name in src/server/web/.
struct WebAsset {
  std::string_view name;
  std::string_view content;
};

// Every embedded file; defined in the .cpp that web.cmake generates.
const WebAsset* web_assets(size_t* count);

// GET / (the page) and GET /web/<name> (its style and script). No authentication: the page holds
// no secrets; its requests carry the API key the user types in.
void add_web_routes(httplib::Server& http);

}  // namespace torchtpu::server
