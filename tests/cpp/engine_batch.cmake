# src/engine's Batch (issue #17): sequences decoded together give the tokens each gives alone, on
# the CPU and, with fixed shapes and padding rows, on the stand-in device of tests/device.
if(TORCHTPU_GTESTS AND TARGET torchtpu_engine AND TARGET torchtpu_standin)
  add_executable(batch_test ${CMAKE_CURRENT_LIST_DIR}/batch_test.cpp)
  target_include_directories(batch_test PRIVATE ${CMAKE_SOURCE_DIR}/tests/device)
  target_link_libraries(batch_test PRIVATE torchtpu_engine torchtpu_standin GTest::gtest_main)
  torchtpu_precompile_aten(batch_test)
  torchtpu_gtest_suites(batch_test TEST_PREFIX "engine_batch."
                        LABELS engine TIMEOUT 900
                        ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endif()
# The Batch's prefix cache: hits give the tokens and logits (1e-4 at f32) of a fresh read.
if(TORCHTPU_GTESTS AND TARGET torchtpu_engine)
  add_executable(prefix_cache_test ${CMAKE_CURRENT_LIST_DIR}/prefix_cache_test.cpp)
  target_link_libraries(prefix_cache_test PRIVATE torchtpu_engine GTest::gtest_main)
  torchtpu_precompile_aten(prefix_cache_test)
  torchtpu_gtest_suites(prefix_cache_test TEST_PREFIX "engine_prefix_cache."
                        LABELS engine TIMEOUT 900
                        ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endif()
# The engine's scheduler: sequences from many threads decoded together, the queue's bound,
# cancels, and failures that end only what they must.
if(TORCHTPU_GTESTS AND TARGET torchtpu_engine)
  add_executable(scheduler_test ${CMAKE_CURRENT_LIST_DIR}/scheduler_test.cpp)
  target_link_libraries(scheduler_test PRIVATE torchtpu_engine GTest::gtest_main)
  torchtpu_precompile_aten(scheduler_test)
  torchtpu_gtest_suites(scheduler_test TEST_PREFIX "engine_scheduler."
                        LABELS engine TIMEOUT 900
                        ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endif()
# src/engine/media (issue #19): placeholder expansion, cache keys and digests.
if(TORCHTPU_GTESTS AND TARGET torchtpu_engine)
  add_executable(media_engine_test ${CMAKE_CURRENT_LIST_DIR}/media_engine_test.cpp)
  target_link_libraries(media_engine_test PRIVATE torchtpu_engine GTest::gtest_main)
  torchtpu_precompile_aten(media_engine_test)
  torchtpu_gtest_suites(media_engine_test LABELS engine)
endif()
# Speculative decoding by prompt lookup: the drafter, and decodes with drafts giving the tokens
# and logits (1e-4 at f32) of decodes without.
if(TORCHTPU_GTESTS AND TARGET torchtpu_engine)
  add_executable(draft_test ${CMAKE_CURRENT_LIST_DIR}/draft_test.cpp)
  target_link_libraries(draft_test PRIVATE torchtpu_engine GTest::gtest_main)
  torchtpu_precompile_aten(draft_test)
  torchtpu_gtest_suites(draft_test TEST_PREFIX "engine_draft."
                        LABELS engine TIMEOUT 900
                        ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endif()
