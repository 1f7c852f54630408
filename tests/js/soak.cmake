# Soak and faults (issue #16): `torchtpu-cpp serve` on the demo checkpoint under many concurrent
# clients, some leaving mid-answer; SIGTERM under load; slow and oversized requests. The short
# profile runs here (well under a minute); TORCHTPU_SOAK=long in the environment of ctest selects
# the long one (docs/RELIABILITY.md, "Soak and faults").
find_program(NODE_EXECUTABLE node)
if(NODE_EXECUTABLE AND TARGET torchtpu-cpp AND TARGET torchtpu_server)
  add_test(NAME js_soak
           COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1
                   ${CMAKE_CURRENT_LIST_DIR}/soak.test.mjs
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
  set_tests_properties(js_soak PROPERTIES
    ENVIRONMENT "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache"
    TIMEOUT 1800 LABELS server)
endif()
