# The engine against llama.cpp (issue #9 item 5): GGUF exports of tiny checkpoints run through
# node-llama-cpp's prebuilt llama.cpp (`npm ci --prefix bench` installs it), greedy tokens and
# log-probabilities compared, and the Q4_0 repack checked bit for bit.
set(_llamacpp_env "OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1")
if(TARGET torchtpu-cpp)
  list(APPEND _llamacpp_env "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>")
endif()
add_test(NAME py_llamacpp_agreement
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                 ${CMAKE_CURRENT_LIST_DIR}/test_llamacpp_agreement.py)
set_tests_properties(py_llamacpp_agreement PROPERTIES ENVIRONMENT "${_llamacpp_env}" TIMEOUT 900
                     LABELS llamacpp)
