// Who may use the server and the proxy: the API key ("Authorization: Bearer KEY", as OpenAI
// clients send it; the server also takes Anthropic clients' "x-api-key: KEY"), and the rules that
// keep web pages of other sites out.
#pragma once

#include <httplib.h>

#include <string>
#include <string_view>

namespace torchtpu::server {

// Whether `given` is exactly `expected`. The comparison takes the same time wherever the first
// difference is, so timing does not reveal a key's prefix.
inline bool key_matches(std::string_view given, std::string_view expected) {
  unsigned diff = given.size() ^ expected.size();
  for (size_t i = 0; i < given.size() && i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(given[i]) ^ static_cast<unsigned char>(expected[i]);
  }
  return diff == 0;
}

// Whether `authorization` (the request's Authorization header) is exactly "Bearer " + key.
inline bool bearer_matches(std::string_view authorization, std::string_view key) {
  return key_matches(authorization, "Bearer " + std::string(key));
}

// Whether a bind address reaches only this machine: localhost, 127.0.0.0/8 or ::1.
inline bool is_loopback(std::string_view address) {
  return address == "localhost" || address == "::1" || address == "[::1]" ||
         address.starts_with("127.");
}

// Why a request that a web browser may have sent is refused, or "" when it is not. Only a server
// bound to loopback checks Host: there it must name localhost, 127.0.0.1 or [::1], because a page
// of another site whose name was made to resolve to 127.0.0.1 (DNS rebinding) sends its own name,
// and would otherwise read the answers. A request that carries an Origin must come from a page of
// the host it names or of localhost, so other sites' pages cannot make the server work for them.
inline std::string browser_refusal(const httplib::Request& req, bool loopback) {
  auto local = [](std::string_view host_port) {
    for (std::string_view name : {"localhost", "127.0.0.1", "[::1]"}) {
      if (host_port == name ||
          (host_port.starts_with(name) && host_port.substr(name.size()).starts_with(":"))) {
        return true;
      }
    }
    return false;
  };
  const std::string host = req.get_header_value("Host");
  if (loopback && !local(host)) {
    return "Host '" + host +
           "' is not this server's: a server on loopback answers only localhost, 127.0.0.1 and "
           "[::1]";
  }
  if (!req.has_header("Origin")) return "";
  const std::string origin = req.get_header_value("Origin");
  for (std::string_view scheme : {"http://", "https://"}) {
    if (origin.starts_with(scheme) && (origin.substr(scheme.size()) == host ||
                                       local(std::string_view(origin).substr(scheme.size())))) {
      return "";
    }
  }
  return "Origin '" + origin + "' is another site's: only pages of this host may call it";
}

// A browser's CORS preflight: the OPTIONS request it sends before a request a page may not send
// unasked (one with a key, or a JSON body).
inline bool is_preflight(const httplib::Request& req) {
  return req.method == "OPTIONS" && req.has_header("Origin") &&
         req.has_header("Access-Control-Request-Method");
}

// Answers a preflight that browser_refusal lets through: 204 allowing `methods` and the headers it
// asks for. It carries no key (no preflight does), so none is asked for.
inline void allow_preflight(const httplib::Request& req, httplib::Response& res,
                            const char* methods) {
  res.status = 204;
  res.set_header("Access-Control-Allow-Methods", methods);
  if (req.has_header("Access-Control-Request-Headers")) {
    res.set_header("Access-Control-Allow-Headers",
                   req.get_header_value("Access-Control-Request-Headers"));
  }
  res.set_header("Access-Control-Max-Age", "600");
}

// A page browser_refusal lets call a server may read its answers too (CORS), as Ollama lets
// localhost's pages: a development UI on another local port, a browser extension.
inline void allow_origin(const httplib::Request& req, httplib::Response& res, bool loopback) {
  if (req.has_header("Origin") && browser_refusal(req, loopback).empty()) {
    res.set_header("Access-Control-Allow-Origin", req.get_header_value("Origin"));
    res.set_header("Vary", "Origin");
  }
}

}  // namespace torchtpu::server
