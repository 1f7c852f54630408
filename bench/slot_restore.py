"""A conversation handed from one server to another through a slot file (serve --slot-save-path,
POST /slots/{id}?action=save|restore): server A reads each round's first turn of about N prompt
tokens in slot 0 and saves the slot to a file; server B, started afresh on the same weights,
restores each file and answers the second turn from it, and answers the same second turn again
under another cache_salt (which no restored state serves), reading it all. Per round: the file's
size, save and restore times, and both second turns' times to their one token.

    python bench/slot_restore.py --model DIR [--emb4 DIR] [--rounds 3] [--turn-prompt 4000]
        [--context 8192] [--cli build/torchtpu-cpp]

Prints one JSON object; docs/BENCHMARKS.md, "A conversation handed over through a slot file",
has the figures.
"""

import argparse
import json
import re
import subprocess
import tempfile
import time
import urllib.request


def post(url, path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=1200) as r:
        answer = json.loads(r.read())
    return time.perf_counter() - start, answer


def completion(url, prompt, max_tokens, **extra):
    return post(url, "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens,
                                         "temperature": 0, "ignore_eos": True, **extra})


class Server:
    def __init__(self, args, slots):
        cmd = [args.cli, "serve", "--port", "0", "--model", args.model, "--context",
               str(args.context), "--slot-save-path", slots, "--parallel", "1"]
        if args.emb4:
            cmd += ["--emb4", args.emb4]
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        text=True)
        line = self.process.stdout.readline()
        self.url = re.search(r"serving \S+ on (http://\S+)", line).group(1)
        while True:
            try:
                if urllib.request.urlopen(self.url + "/health", timeout=5).status == 200:
                    return
            except OSError:
                time.sleep(0.5)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--emb4", default="")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--turn-prompt", type=int, default=4000)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--cli", default="build/torchtpu-cpp")
    args = p.parse_args()
    slots = tempfile.mkdtemp(prefix="slot-restore-bench-")
    firsts, rounds = [], []
    a = Server(args, slots)
    try:
        for index in range(args.rounds):
            # Each round its own text, so no round reads another's states.
            first = f"Round {index}." + " The rain falls on the town." * (args.turn_prompt // 7)
            first_s, answer = completion(a.url, first, 4, id_slot=0)
            _, saved = post(a.url, "/slots/0?action=save", {"filename": f"round{index}.bin"})
            firsts.append(first + answer["choices"][0]["text"] + " Go on.")
            rounds.append({"first_turn_prompt_tokens": answer["usage"]["prompt_tokens"],
                           "first_turn_s": round(first_s, 3), "n_saved": saved["n_saved"],
                           "file_bytes": saved["n_written"],
                           "save_ms": round(saved["timings"]["save_ms"], 1)})
    finally:
        a.stop()
    b = Server(args, slots)
    try:
        for index, second in enumerate(firsts):
            _, restored = post(b.url, "/slots/0?action=restore", {"filename": f"round{index}.bin"})
            warm_s, warm = completion(b.url, second, 1)
            cold_s, cold = completion(b.url, second, 1, cache_salt=f"cold {index}")
            rounds[index].update({
                "restore_ms": round(restored["timings"]["restore_ms"], 1),
                "second_turn_prompt_tokens": warm["usage"]["prompt_tokens"],
                "restored_second_turn_s": round(warm_s, 3),
                "restored_cached_tokens": warm["usage"]["prompt_tokens_details"]["cached_tokens"],
                "unrestored_second_turn_s": round(cold_s, 3),
                "unrestored_cached_tokens": cold["usage"]["prompt_tokens_details"]["cached_tokens"],
                "same_token": warm["choices"][0]["text"] == cold["choices"][0]["text"],
            })
    finally:
        b.stop()
    print(json.dumps({"model": args.model, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
