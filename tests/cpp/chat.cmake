# torchtpu_chat is defined by src/text/chat.cmake, which src/text/CMakeLists.txt includes; a tree
# whose src/text does not include it yet still builds these tests.
if(NOT TARGET torchtpu_chat)
  include(${CMAKE_CURRENT_LIST_DIR}/../../src/text/chat.cmake)
endif()

if(TORCHTPU_GTESTS)
  add_executable(chat_template_test ${CMAKE_CURRENT_LIST_DIR}/chat_template_test.cpp)
  target_link_libraries(chat_template_test PRIVATE torchtpu_chat GTest::gtest_main)
  torchtpu_gtest_suites(chat_template_test)
endif()

# Renders templates for the Python cross-check against transformers (tests/python/chat.cmake).
add_executable(chat_template_render ${CMAKE_CURRENT_LIST_DIR}/chat_template_render.cpp)
target_link_libraries(chat_template_render PRIVATE torchtpu_chat)
