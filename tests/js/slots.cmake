# llama-server's slot save, restore and erase (--slot-save-path): a prefix state handed from one
# server to the next through a file, and every wrong request's error.
torchtpu_js_suite(js_slots FILES slots.test.mjs)
