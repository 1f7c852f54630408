# The Node suites (tests/js/*.test.mjs), each a CTest entry that runs its files through node's test
# runner one file at a time, against the CLI's server. Every entry gets the CLI, a cache for the
# demo checkpoints they generate, and the project's Python (which writes the tiny multimodal
# checkpoints and assistants some of them serve).
find_program(NODE_EXECUTABLE node)

# torchtpu_js_suite(NAME FILES file.test.mjs... [TIMEOUT seconds] [ENV VAR=value...]): the files
# relative to the calling fragment's directory, which is also the working directory. Registers
# nothing without node or the CLI (a build without the server).
function(torchtpu_js_suite name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "TIMEOUT" "FILES;ENV")
  if(NOT NODE_EXECUTABLE OR NOT TARGET torchtpu-cpp OR NOT TARGET torchtpu_server)
    return()
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 600)
  endif()
  list(TRANSFORM arg_FILES PREPEND ${CMAKE_CURRENT_LIST_DIR}/)
  add_test(NAME ${name}
           COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1 ${arg_FILES}
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
  set(_env "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>" "XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache"
           "TORCHTPU_PYTHON=${Python3_EXECUTABLE}" ${arg_ENV})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${_env}" TIMEOUT ${arg_TIMEOUT}
                       LABELS server)
endfunction()
