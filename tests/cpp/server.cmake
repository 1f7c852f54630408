# src/server: request parsing, stop sequences, metrics text and the disconnect check.
if(TARGET torchtpu_server)
  add_executable(server_test ${CMAKE_CURRENT_LIST_DIR}/server_test.cpp)
  target_link_libraries(server_test PRIVATE torchtpu_server GTest::gtest_main)
  gtest_discover_tests(server_test TEST_PREFIX "server." PROPERTIES LABELS server)
endif()
