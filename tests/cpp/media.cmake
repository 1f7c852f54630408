# src/media: image sizes and patch layout, and decode_image's refusals (pixel parity with Pillow and
# transformers is tests/python/test_vision.py).
if(TORCHTPU_GTESTS AND TARGET torchtpu_media)
  add_executable(media_test ${CMAKE_CURRENT_LIST_DIR}/media_test.cpp)
  target_link_libraries(media_test PRIVATE torchtpu_media GTest::gmock GTest::gtest_main)
  torchtpu_precompile_aten(media_test)
  torchtpu_gtest_suites(media_test TEST_PREFIX "media.")
endif()
