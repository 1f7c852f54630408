# The endpoint picker's own code over a real server's /metrics (issue #21): the Gateway API
# Inference Extension v1.5.0 scrape and core metrics extractor, configured as the Helm chart
# configures them, and Prometheus' strict text parser. scripts/setup.sh downloads the modules.
# On a fresh machine `go test` first compiles the extension's Kubernetes dependencies (the whole
# test took 446 s of a 2-core fresh-clone run), now beside rig_boot's compiler: both start first
# (tests/CMakeLists.txt), so its timeout leaves room for that.
# The servers' cache (XDG_CACHE_HOME) lives in the build tree, but Go's build cache must not follow
# it there: under a fresh clone's build tree that cache starts empty, and the compile above ran on
# every CI run (343 s of a 2-core run on a machine whose own Go cache held it all).
find_program(GO_EXECUTABLE go)
if(GO_EXECUTABLE AND TARGET torchtpu-cpp)
  execute_process(COMMAND ${GO_EXECUTABLE} env GOCACHE OUTPUT_VARIABLE _go_cache
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  add_test(NAME go_epp_metrics
           COMMAND ${GO_EXECUTABLE} test -count=1 -v ./...
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
  set_tests_properties(go_epp_metrics PROPERTIES
    ENVIRONMENT "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache;TORCHTPU_HELM=${CMAKE_SOURCE_DIR}/.cache/tools/helm-v3.22.0/helm;GOCACHE=${_go_cache}"
    TIMEOUT 1800 LABELS "server;deploy")
endif()
