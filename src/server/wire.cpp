#include "server/wire.h"

namespace torchtpu::server {

std::string sse_event(const std::string& name, const ojson& data) {
  return "event: " + name + "\ndata: " + dump(data) + "\n\n";
}

ojson parse_arguments(const std::string& arguments, const std::string& param) {
  ojson parsed;
  try {
    parsed = parse_json(arguments);
  } catch (const nlohmann::json::exception&) {
    throw ApiError(400, "'" + param + "' is not a JSON object: " + ojson(arguments).dump(),
                   "invalid_request_error", param, "invalid_value");
  } catch (const JsonTooDeep& e) {
    throw ApiError(400, "'" + param + "' is refused: " + e.what(), "invalid_request_error", param,
                   "json_too_deep");
  }
  if (!parsed.is_object()) {
    throw ApiError(400, "'" + param + "' must be a JSON object, got " + ojson(arguments).dump(),
                   "invalid_request_error", param, "invalid_value");
  }
  return parsed;
}

ApiError renamed(const ApiError& error,
                 const std::vector<std::pair<std::string, std::string>>& prefixes) {
  for (const auto& [chat, own] : prefixes) {
    if (error.param.rfind(chat, 0) != 0) continue;
    std::string message = error.what();
    for (size_t at = message.find(chat); at != std::string::npos;
         at = message.find(chat, at + own.size())) {
      message.replace(at, chat.size(), own);
    }
    return ApiError(error.status, message, error.type, own + error.param.substr(chat.size()),
                    error.code);
  }
  return error;
}

}  // namespace torchtpu::server
