// The error kinds of torchtpu-cpp. A check chooses its kind where it is written; the Python module
// and the HTTP server each map kinds to exceptions / statuses in one place.
#pragma once

#include <stdexcept>
#include <string>

namespace torchtpu {

// A value the caller passed is wrong (ids outside the vocabulary, max_new < 1, a prompt longer
// than the context). Python: ValueError. HTTP: 400.
struct ValueError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A file on disk is corrupt, inconsistent or of a kind we do not support (checkpoint, config,
// tokenizer). The message names the file and what is wrong. Python: ValueError. HTTP: 500 at load.
struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Something the caller asked for does not exist (a model id, a file). Python: FileNotFoundError /
// ValueError. HTTP: 404.
struct NotFoundError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A service the engine depends on did not give what it was asked for: the Hub could not be
// reached, refused the token, failed, or broke off a download. The message names the service and
// what to do. Python: ConnectionError. HTTP: 502 (the server is a gateway to it).
struct UpstreamError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace torchtpu
