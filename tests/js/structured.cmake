# Structured output (issue #18) through the official `openai` SDK on the demo checkpoint: the
# validity proof (every constrained reply of 210 parses and validates with ajv), and
# chat.completions.parse with zod, forced tool calls, streaming and the 400s.
foreach(_suite structured_valid structured)
  torchtpu_js_suite(js_${_suite} FILES ${_suite}.test.mjs)
endforeach()
