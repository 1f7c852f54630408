# LoRA adapters in PEFT's format: the engine's logits and tokens against PEFT's model over
# transformers' Gemma 4, adapters per row of a batch, the prefix cache's separation, refusals.
if(TARGET _torchtpu_cpp)
  add_test(NAME py_lora
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_LIST_DIR}/test_lora.py)
  set_tests_properties(py_lora PROPERTIES
    ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1"
    TIMEOUT 600 LABELS "python;engine")
endif()
