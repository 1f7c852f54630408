# A replica behind a router (issue #21): /metrics without the key and under vLLM's names,
# readiness apart from liveness, model aliases on every generation route, the new flags' errors,
# and a second signal ending the drain. The drain under load is js_soak's.
find_program(NODE_EXECUTABLE node)
if(NODE_EXECUTABLE AND TARGET torchtpu-cpp AND TARGET torchtpu_server)
  add_test(NAME js_scale
           COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1
                   ${CMAKE_CURRENT_LIST_DIR}/scale.test.mjs
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
  set_tests_properties(js_scale PROPERTIES
    ENVIRONMENT "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache"
    TIMEOUT 600 LABELS server)
endif()
