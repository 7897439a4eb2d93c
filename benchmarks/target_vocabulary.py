"""The output layer as a lever where the deployment target is missed: CTranslate2 models whose target vocabulary
keeps only the words that occur in the training references (in a joint dictionary most others are source-side words),
against the same models with the full vocabulary, in CTranslate2 int8.

BLEU and the hypotheses that change are measured on held-out data (Multi30k val for the bundled model, never the
test set of the tables); speed at equal work (every hypothesis forced to the full unpruned model's mean length),
rounds timed batch by batch in a random order (deploy's timing), as ratios of seconds within a round to the first
model's full vocabulary. FLOP ratios beside.

  python benchmarks/target_vocabulary.py DATA --path UNPRUNED.pt [--compare NAME=CKPT ...] --words-from train \\
      --gen-subset valid --references REF --out DIR [--runs 3] [fairseq decoding options]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def target_words(loaded, subset: str) -> set:
    """The target-dictionary ids that occur in a subset's references."""
    loaded.task.load_dataset(subset)
    dataset = loaded.task.dataset(subset)
    seen = set()
    for i in range(len(dataset)):
        seen.update(dataset.tgt[i].tolist())
    return seen


def trimmed_translator(loaded, words, folder: str):
    """A CTranslate2 int8 translator of the model with only these target words, and the shape it runs."""
    import copy

    from fairseq_headprune.core.surgery import cut_target_vocabulary
    from fairseq_headprune.engines.ct2 import ct2_shape, ct2_translator

    model = copy.deepcopy(loaded.model)
    dictionary = cut_target_vocabulary(model, loaded.task.target_dictionary, words)
    return ct2_translator(loaded, model, folder, "int8", dictionary), ct2_shape(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data")
    parser.add_argument("--path", required=True)
    parser.add_argument("--compare", nargs="*", action="extend", default=[], metavar="NAME=CKPT")
    parser.add_argument("--words-from", default="train", help="the subset whose references give the words kept")
    parser.add_argument("--gen-subset", default="valid")
    parser.add_argument("--references", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", type=int, default=3)
    args, decoding = parser.parse_known_args()

    from fairseq_headprune.core import flops
    from fairseq_headprune.cli import _quiet_dependencies, parse
    from fairseq_headprune.cli import shrink as command
    from fairseq_headprune.engines import timing
    from fairseq_headprune.engines.ct2 import ct2_run, ct2_shape
    from fairseq_headprune.engines.timing import paired_ratio
    from fairseq_headprune.fairseq_io.loading import load, load_other, trust_fairseq_checkpoints
    from fairseq_headprune.records.log import atomic_output, write_json_atomic
    from fairseq_headprune.studies.deploy import Contender, DeployOptions

    trust_fairseq_checkpoints()
    _quiet_dependencies()
    cfg, _ = parse("shrink", command, [args.data, "--path", args.path, "--gen-subset", args.gen_subset, *decoding])
    base = load(cfg)
    options = DeployOptions(subset=args.gen_subset, references=args.references, shrink_percent=0,
                            compare=tuple(args.compare))
    words = target_words(base, args.words_from)
    size = len(words | set(range(base.task.target_dictionary.nspecial)))
    models = [("unpruned", base)] + [(n, load_other(base, p)) for n, p in options.named_checkpoints()]
    cells, rows = {}, []
    with tempfile.TemporaryDirectory(prefix="target-vocabulary-") as tmp:
        contenders = {name: Contender(name, loaded, options, tmp) for name, loaded in models}
        for name, loaded in models:
            trimmed, shape = trimmed_translator(loaded, words, os.path.join(tmp, f"{name}-trimmed"))
            cells[(name, "full")] = (contenders[name].translators["ct2-int8"], ct2_shape(loaded.model))
            cells[(name, "trimmed")] = (trimmed, shape)
        first = contenders["unpruned"]
        samples = first.evaluator.samples
        natural = {key: ct2_run(t, first.loaded, first.decoding, samples)["hypotheses"]
                   for key, (t, _) in cells.items()}
        length = round(statistics.mean(len(h) for h in natural[("unpruned", "full")].values()))
        decoders = {key: functools.partial(ct2_run, t, first.loaded, first.decoding, forced=length)
                    for key, (t, _) in cells.items()}
        rounds = timing.measure(decoders, samples, args.runs, seed=lambda r: f"target-vocabulary-{r}")
        # batch by batch, in a seeded random order (deploy's timing)
        seconds = {key: [timing.seconds(results[key]) for results in rounds] for key in cells}
        src_lens = [int(n) for s in samples for n in s["net_input"]["src_lengths"].tolist()]
        batch = max(s["id"].numel() for s in samples)
        for (name, vocab), (_, shape) in cells.items():
            c = contenders[name]
            full = natural[(name, "full")]
            rows.append({
                "model": name, "vocabulary": vocab, "words": shape.vocab,
                "bleu": c.bleu(c.texts(natural[(name, vocab)])),
                "differing_from_full_vocabulary": sum(natural[(name, vocab)][i] != full[i] for i in full),
                "x_unpruned_full_int8_forced": round(
                    paired_ratio(seconds[("unpruned", "full")], seconds[(name, vocab)]), 3),
                "x_same_model_full_int8_forced": round(
                    paired_ratio(seconds[(name, "full")], seconds[(name, vocab)]), 3),
                "flop_ratio_to_unpruned_full": round(flops.flop_ratio(
                    cells[("unpruned", "full")][1], shape, src_lens, [length + 1] * len(src_lens),
                    int(cfg.generation.beam), batch), 3)})
    result = {"subset": args.gen_subset, "sentences": first.evaluator.size, "words_from": args.words_from,
              "words_kept": size, "words_total": len(base.task.target_dictionary), "forced_length": length,
              "runs": args.runs, "beam": int(cfg.generation.beam), "engine": "CTranslate2 int8, one thread",
              "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    write_json_atomic(os.path.join(args.out, "target-vocabulary.json"), result)
    lines = [f"# The output layer: target words of '{args.words_from}' only ({size} of {result['words_total']})", "",
             f"CTranslate2 int8, one thread, beam {result['beam']}; BLEU on '{args.gen_subset}' ({result['sentences']} "
             f"sentences, as decoded); speed at equal work (every hypothesis forced to {length} tokens + 1 step), "
             f"{args.runs} rounds interleaved batch by batch, ratios of seconds within a round.", "",
             "| model | vocabulary | words | BLEU | hypotheses changed | x unpruned full int8 | x same model full | "
             "FLOP ratio |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['vocabulary']} | {r['words']} | {r['bleu']:.2f} | "
              f"{r['differing_from_full_vocabulary']} | {r['x_unpruned_full_int8_forced']:.2f} | "
              f"{r['x_same_model_full_int8_forced']:.2f} | {r['flop_ratio_to_unpruned_full']:.2f} |" for r in rows]
    with atomic_output(os.path.join(args.out, "target-vocabulary.md")) as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps({"wrote": args.out}))


if __name__ == "__main__":
    main()
