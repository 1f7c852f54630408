# Gemma 4 audio (issue #19): the audio tower and embed_audio against transformers on tiny
# checkpoints it saves, log-mel features against its feature extractor, WAV decoding against
# Python's wave module and numpy, resampling against the analytic signal.
if(TARGET _torchtpu_cpp)
  add_test(NAME py_audio
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_LIST_DIR}/test_audio.py)
  set(_audio_env "PYTHONPATH=${CMAKE_BINARY_DIR}/python;OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1")
  set_tests_properties(py_audio PROPERTIES ENVIRONMENT "${_audio_env}" TIMEOUT 900
                       LABELS "python;parity")
endif()
