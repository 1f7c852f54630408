// The server's forced-output test hook (TORCHTPU_TEST_FORCED_OUTPUT) as the wire-format suites use
// it: the demo checkpoint has random weights, so a prompt containing a rule's text gets that
// rule's output, Gemma 4 markup included, as its tokens. The rules they share, and the prompts
// transformers' apply_chat_template renders for their turns.
import fs from "node:fs";
import path from "node:path";
import { startServer, tempDir } from "./server_helpers.mjs";

export const Q = '<|"|>';
export const SUNNY = "It is sunny in Paris, 21 degrees.";
export const RULES = [
  { prompt_contains: "SUNNY-21C", output: SUNNY },
  {
    prompt_contains: "Weather in Paris?",
    output: `<|tool_call>call:get_weather{city:${Q}Paris${Q},unit:${Q}celsius${Q}}<tool_call|>`,
  },
  { prompt_contains: "Weather anywhere?", output: `get_weather{city:${Q}Oslo${Q}}<tool_call|>` },
  { prompt_contains: "Weather in Oslo?", output: `city:${Q}Oslo${Q}}<tool_call|>` },
  { prompt_contains: "What is 2+2?", output: "<|channel>thought\nTwo and two.\n<channel|>It is 4." },
  { prompt_contains: "Say hello", output: "Hello there, friend." },
  {
    prompt_contains: "Two calls",
    output: `<|tool_call>call:get_time{}<tool_call|><|tool_call>call:get_weather{city:${Q}Rome${Q}}<tool_call|>`,
  },
  { prompt_contains: "Tell a long story", output: "Once upon a time there was a story. ".repeat(100) },
];

// What transformers' apply_chat_template renders from the Gemma 4 template (the tokenizer's own
// chat_template.jinja) for a system turn "Be brief." and a user turn "Weather in Paris?": plain,
// with the get_weather tool declared, and with thinking on. Written down as the independent
// reference for the prompts the routes build.
export const RENDERED = {
  plain: "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n",
  tools:
    "<bos><|turn>system\nBe brief.<|tool>declaration:get_weather{description:<|\"|>The weather in a " +
    'city<|"|>,parameters:{properties:{city:{type:<|"|>STRING<|"|>}},required:[<|"|>city<|"|>],' +
    'type:<|"|>OBJECT<|"|>}}<tool|><turn|>\n<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n',
  thinking: "<bos><|turn>system\n<|think|>\nBe brief.<turn|>\n<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n",
};

// How many tokens the server's /tokenize makes of `text` (no BOS added: the reference prompts hold
// their own), with `key` as the bearer token when the server wants one.
export async function tokenCount(url, text, key = "") {
  const res = await fetch(`${url}/tokenize`, {
    method: "POST",
    headers: key ? { authorization: `Bearer ${key}` } : {},
    body: JSON.stringify({ content: text, add_special: false }),
  });
  return (await res.json()).tokens.length;
}

// A server (startServer's) with `args` whose replies follow `rules`.
export async function startForcedServer(rules, args) {
  const dir = tempDir("torchtpu-forced-");
  const file = path.join(dir, "forced.json");
  fs.writeFileSync(file, JSON.stringify(rules));
  return startServer(args, { env: { TORCHTPU_TEST_FORCED_OUTPUT: file } });
}
