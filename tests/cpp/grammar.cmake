# src/grammar: gtest suite for the token masks of constrained decoding (llguidance).
if(TORCHTPU_GTESTS)
  add_executable(grammar_test ${CMAKE_CURRENT_LIST_DIR}/grammar_test.cpp)
  target_link_libraries(grammar_test PRIVATE torchtpu_grammar GTest::gtest_main)
  torchtpu_precompile_aten(grammar_test)
  torchtpu_gtest_suites(grammar_test TEST_PREFIX "grammar.")
endif()
