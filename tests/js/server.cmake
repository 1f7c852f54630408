# The OpenAI-compatible server through clients other people wrote: the official `openai` npm SDK
# against `torchtpu-cpp serve` on the demo checkpoint (generated once into the build tree).
torchtpu_js_suite(js_server FILES server_api.test.mjs server_load.test.mjs)
