# A replica behind a router (issue #21): /metrics without the key and under vLLM's names,
# readiness apart from liveness, model aliases on every generation route, the new flags' errors,
# and a second signal ending the drain. The drain under load is js_soak's.
torchtpu_js_suite(js_scale FILES scale.test.mjs)
