# Sampling, logprobs, thinking and tool calls through the official `openai` SDK (issue #11), on the
# demo checkpoint with the server's forced-output test hook; speculative decoding too, with an
# assistant the project's Python writes for the demo checkpoint.
torchtpu_js_suite(js_api FILES api.test.mjs)
