# src/server/structured: response_format parsing and the tool-call grammar, walked through
# llguidance token by token (issue #18).
if(TORCHTPU_GTESTS AND TARGET torchtpu_server)
  add_executable(structured_test ${CMAKE_CURRENT_LIST_DIR}/structured_test.cpp)
  target_link_libraries(structured_test PRIVATE torchtpu_server GTest::gtest_main)
  torchtpu_precompile_aten(structured_test)
  torchtpu_gtest_suites(structured_test TEST_PREFIX "structured.")
endif()
