"""What speculative decoding (Engine.decode's draft_max, `serve --draft-max`) costs and gives on
this machine, by prompt lookup or from an assistant (--draft-model).

    python bench/speculative.py --model DIR [--emb4 DIR] [--drafts 1,2,4,8] [--new 64]
        [--rounds 3] [--context 2048] [--threads 0] [--int4-activation-bits 16] [--streams 1,2,4]
        [--draft-model DIR]

With --draft-model the drafts come from that assistant. bench/make_assistant.py writes one of
E2B's shapes whose head sees zeros, so that it guesses one token whatever it is given: that token
is the one forced below, so every draft is kept in the first measure and almost none in the
second (synthetic weights do not follow the passage), and the JSON adds what the assistant itself
takes per draft token (`assistant_ms_per_token`, Engine.draft timed for 1 and 65 drafts).

Three measures, each against plain decoding in the same round:

- Every draft kept: a logit bias of +100 on one token makes every step choose it, so after two
  tokens each draft of k is kept whole and a pass over 1 + k positions yields k + 1 tokens. Its
  rate over plain decoding's (the same bias) is the most drafts of k can give here, and
  (k + 1) x plain's rate / its rate is what one pass over 1 + k positions costs in one-token
  steps: a draft pays when more of its tokens than that, less one, are kept on average.
- The model's own output: greedy, after a prompt that says one random passage three times, as a
  reply that quotes its input would; drafts kept over drafts checked, and the rate over plain's.
  With synthetic weights the output does not follow the passage, so this is the floor: what
  drafting costs when few drafts are kept.
- Several streams in a Batch, draft_max 7, both cases again (every draft kept; the model's own
  output, each stream quoting its own passage): the aggregate rate of `streams` sequences decoded
  together (Batch.decode_many, wall time, prompts included) with drafts over without. A pass's
  drafts share 8 positions on the CPU, so one stream drafts 7 tokens, two 3 each, four 1 each.

Every drafting decode runs twice: with drafts checked whenever found (`draft_always`) and as
by default, where the engine's gate checks them only while drafting passes give tokens faster
than plain steps (engine/draft.h, DraftGate).

Prints one JSON object; docs/BENCHMARKS.md, "Speculative decoding by prompt lookup", has the
figures.
"""

import argparse
import json
import statistics
import time

import torchtpu_cpp as tt

FORCED = 1234  # an ordinary id the bias forces
MODES = {"always": {"draft_always": True}, "gated": {}}


def rate(result):
    """Decode steps' tokens per second: the first token belongs to the prompt's read."""
    return (len(result.tokens) - 1) / result.decode_s


def outcome(drafting, plain):
    """A decode with drafts beside the plain one: its rate, its drafts, and where its tokens first
    differ from plain's (None: nowhere). At bf16 a pass over several positions rounds otherwise
    than single steps, so a near tie can go the other way (docs/ARCHITECTURE.md)."""
    pairs = zip(drafting.tokens, plain.tokens)
    return {
        "tok_s": rate(drafting),
        "drafted": drafting.drafted,
        "accepted": drafting.accepted,
        "first_difference": next((i for i, (a, b) in enumerate(pairs) if a != b), None),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--emb4", default="")
    p.add_argument("--drafts", default="1,2,4,8")
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--int4-activation-bits", type=int, default=16)
    p.add_argument("--streams", default="1,2,4")
    p.add_argument("--draft-model", default=None)
    args = p.parse_args()
    streams = [int(s) for s in args.streams.split(",") if s]
    drafts = [int(k) for k in args.drafts.split(",")]
    engine = tt.Engine(
        args.model,
        args.emb4,
        context=args.context,
        threads=args.threads,
        int4_activation_bits=args.int4_activation_bits,
        draft_model=args.draft_model,
    )
    vocab = engine.vocab_size
    passage = [4 + (i * 104729) % (vocab - 4) for i in range(40)]
    quoting = [2] + passage * 3
    # The assistant's one guess (its first draft after any prompt), or an ordinary id.
    guess = engine.draft([2, 5, 7], 1)[1] if args.draft_model else FORCED
    forced = {"logit_bias": {guess: 100.0}}
    engine.decode([2, 5, 7], 4, stop=())  # warm-up
    assistant_ms = []
    if args.draft_model:
        for _ in range(args.rounds):
            took = {}
            for count in (1, 65):
                start = time.perf_counter()
                engine.draft(quoting, count)
                took[count] = time.perf_counter() - start
            assistant_ms.append((took[65] - took[1]) / 64 * 1e3)

    rounds = []
    for _ in range(args.rounds):
        r = {"kept_all": {}, "own": {}}
        plain = engine.decode([2, 5, 7], args.new, stop=(), **forced)
        r["kept_all"]["plain_tok_s"] = rate(plain)
        for k in drafts:
            r["kept_all"][k] = {
                mode: outcome(
                    engine.decode([2, 5, 7], args.new, stop=(), draft_max=k, **forced, **how),
                    plain,
                )
                for mode, how in MODES.items()
            }
        plain = engine.decode(quoting, args.new, stop=())
        r["own"]["plain_tok_s"] = rate(plain)
        for k in drafts:
            r["own"][k] = {
                mode: outcome(
                    engine.decode(quoting, args.new, stop=(), draft_max=k, **how), plain
                )
                for mode, how in MODES.items()
            }
        r["streams"] = {"kept_all": {}, "own": {}}
        for n in streams:
            cases = {
                "kept_all": ([[2, 5, 7 + i] for i in range(n)], forced),
                "own": ([[2] + (passage[i:] + passage[:i]) * 3 for i in range(n)], {}),
            }
            for case, (prompts, bias) in cases.items():
                timed, kept = {}, {}
                for mode, how in {"plain": {"draft_max": 0}, **MODES}.items():
                    options = {"draft_max": 7, **how}
                    start = time.perf_counter()
                    results = engine.batch(rows=n).decode_many(
                        prompts, args.new, stop=(), **options, **bias
                    )
                    wall = time.perf_counter() - start
                    timed[mode] = sum(len(x.tokens) for x in results) / wall
                    kept[mode] = [
                        sum(x.accepted for x in results),
                        sum(x.drafted for x in results),
                    ]
                r["streams"][case][n] = {
                    "plain_tok_s": timed["plain"],
                    **{
                        mode: {"tok_s": timed[mode], "accepted_of_drafted": kept[mode]}
                        for mode in MODES
                    },
                }
        rounds.append(r)

    summary = {}
    for case in ("kept_all", "own"):
        plain = statistics.median(r[case]["plain_tok_s"] for r in rounds)
        summary[case] = {"plain_tok_s": plain}
        for k in drafts:
            summary[case][k] = {}
            for mode in MODES:
                runs = [r[case][k][mode] for r in rounds]
                with_k = statistics.median(x["tok_s"] for x in runs)
                entry = {"tok_s": with_k, "over_plain": with_k / plain}
                entry["accepted_of_drafted"] = [runs[-1]["accepted"], runs[-1]["drafted"]]
                entry["first_difference"] = [x["first_difference"] for x in runs]
                if case == "kept_all":
                    entry["pass_cost_in_steps"] = (k + 1) * plain / with_k
                summary[case][k][mode] = entry
    summary["streams"] = {"kept_all": {}, "own": {}}
    for case, by_streams in summary["streams"].items():
        for n in streams:
            runs = [r["streams"][case][n] for r in rounds]
            by_streams[n] = {"plain_tok_s": statistics.median(x["plain_tok_s"] for x in runs)}
            for mode in MODES:
                by_streams[n][mode] = {
                    "tok_s": statistics.median(x[mode]["tok_s"] for x in runs),
                    "over_plain_per_round": [x[mode]["tok_s"] / x["plain_tok_s"] for x in runs],
                    "accepted_of_drafted": runs[-1][mode]["accepted_of_drafted"],
                }
    print(
        json.dumps(
            {
                "model": args.model,
                "draft_model": args.draft_model,
                "assistant_ms_per_token": assistant_ms,
                "threads": engine.report()["threads"],
                "int4_activation_bits": args.int4_activation_bits,
                "new": args.new,
                "rounds": rounds,
                "medians": summary,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
