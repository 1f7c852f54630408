// An exception's message as a user outside the process may read it. Kept apart from errors.h,
// which libraries without libtorch include.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace torchtpu {

// c10::Error's message without the C++ backtrace torch appends to what() ("Exception raised
// from ...", then frames with load addresses and library paths: the process's layout, not
// something to answer a request with); any other exception's what(). Log what() where the
// backtrace helps whoever runs the process.
inline std::string error_message(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

}  // namespace torchtpu
