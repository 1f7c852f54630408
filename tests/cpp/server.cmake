# src/server: request parsing, stop sequences, metrics text, the disconnect check, and run() hosted
# on a thread of its own with an engine factory (on the demo checkpoint, generated once per build
# tree into js-cache, which the JS suite shares). One CTest entry: each process start loads libtorch.
if(TORCHTPU_GTESTS AND TARGET torchtpu_server)
  add_executable(server_test ${CMAKE_CURRENT_LIST_DIR}/server_test.cpp)
  target_link_libraries(server_test PRIVATE torchtpu_server GTest::gtest_main)
  torchtpu_precompile_aten(server_test)
  add_test(NAME server_test COMMAND server_test)
  set_tests_properties(server_test PROPERTIES LABELS server
                       ENVIRONMENT "XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache;OMP_NUM_THREADS=1")
endif()
