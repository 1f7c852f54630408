# src/text: gtest suite for the tokenizer, detokenizer and output parser, plus tokenizer_tool,
# the stdin/stdout driver that tests/python/test_tokenizer.py compares with HF tokenizers.
if(TORCHTPU_GTESTS)
  add_executable(text_test ${CMAKE_CURRENT_SOURCE_DIR}/cpp/text_test.cpp)
  target_link_libraries(text_test PRIVATE torchtpu_text GTest::gtest_main)
  torchtpu_gtest_suites(text_test)
endif()

add_executable(tokenizer_tool ${CMAKE_CURRENT_SOURCE_DIR}/cpp/tokenizer_tool.cpp)
target_link_libraries(tokenizer_tool PRIVATE torchtpu_text)
