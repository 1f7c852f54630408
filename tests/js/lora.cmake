# LoRA adapters through the server: the tokens PEFT decodes with an adapter, chosen by model name
# or llama-server's per-request `lora`, side by side with other adapters in one batch; the
# scales of POST /lora-adapters; every malformed request's error.
torchtpu_js_suite(js_lora FILES lora.test.mjs)
