"""A model with its vocabulary trimmed (`shrink --keep-vocab`) against the untrimmed one, both exported to
CTranslate2 and decoded on the untrimmed model's DATA (source tokens as strings: a dropped one reads as <unk>; the
trimmed model's words mapped back to the untrimmed ids): BLEU and chrF on each set with their paired-bootstrap p
(compress's report: compress.stages.report.scored_pair), speed at equal work in interleaved rounds with its 95%
interval (compress's measure), each folder's bytes on disk and resident memory.

  python benchmarks/vocab_trim.py DATA --path UNPRUNED.pt --untrimmed CT2_DIR --trimmed CT2_DIR \
      --subsets test=REFS,mtnt=REFS --timing-subset valid --out OUT.json [fairseq decoding options]
"""
from __future__ import annotations

import os
import statistics
import sys
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)  # a PYTHONPATH snapshot of the package, when given, stays first


def add_args(parser) -> None:
    group = parser.add_argument_group("vocab_trim")
    group.add_argument("--untrimmed", required=True, metavar="CT2_DIR", help="export-ct2 of the untrimmed model")
    group.add_argument("--trimmed", required=True, metavar="CT2_DIR", help="export-ct2 of the trimmed model")
    group.add_argument("--subsets", required=True, metavar="SUBSET=REFERENCES[,...]")
    group.add_argument("--engine", default="ct2-int8")
    group.add_argument("--timing-subset", default="valid")
    group.add_argument("--timing-sentences", type=int, default=300)
    group.add_argument("--runs", type=int, default=3)
    group.add_argument("--out", required=True)


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(folder) for name in names)


def speed(loaded, models, args) -> dict:
    """The trimmed model over the untrimmed one at equal work (forced to the untrimmed model's mean length), batch
    by batch in interleaved rounds, with its 95% interval."""
    from fairseq_headprune.engines.timing import paired_speedup, speedup_interval, timed_rounds
    from fairseq_headprune.prune.levers import timing_batches, timing_rounds

    batches = timing_batches(loaded, args.timing_subset, args.timing_sentences)
    natural = models["unpruned"].run(batches)
    length = max(1, round(statistics.mean(len(h) for h in natural["hypotheses"].values())))
    rounds = timing_rounds(len(batches), args.runs)
    seconds = timed_rounds({k: m.run for k, m in models.items()}, batches, rounds, length)
    return {"subset": args.timing_subset, "sentences": sum(int(b["id"].numel()) for b in batches),
            "forced_length": length, "speedup_equal_work": round(paired_speedup(seconds["unpruned"],
                                                                                seconds["compressed"]), 3),
            "interval": speedup_interval(seconds["unpruned"], seconds["compressed"], len(batches))}


def main(argv) -> int:
    from fairseq_headprune.cli import _quiet_dependencies, parse
    from fairseq_headprune.compress.stages.report import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED, scored_pair
    from fairseq_headprune.engines.ct2 import instruction_set, resident_bytes
    from fairseq_headprune.engines.engine_model import COMPUTE_TYPE, EngineModel
    from fairseq_headprune.fairseq_io.loading import load, trust_fairseq_checkpoints
    from fairseq_headprune.prune.levers import cpu_model
    from fairseq_headprune.records.identity import decoding_identity
    from fairseq_headprune.records.log import write_json_atomic

    trust_fairseq_checkpoints()
    _quiet_dependencies()
    cfg, args = parse("vocab_trim", SimpleNamespace(add_args=add_args), argv)
    loaded = load(cfg)
    folders = {"unpruned": args.untrimmed, "compressed": args.trimmed}
    models = {k: EngineModel(loaded, args.engine, ct2_folder=f) for k, f in folders.items()}
    out = {"engine": args.engine, "decoding": decoding_identity(cfg), "untrimmed": args.untrimmed,
           "trimmed": args.trimmed, "cpu": cpu_model(), "instruction_set": instruction_set(),
           "significance": f"paired bootstrap of sacreBLEU and chrF against the untrimmed model in {args.engine} "
                           f"({BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}, one-sided)",
           "bytes_on_disk": {k: folder_bytes(f) for k, f in folders.items()},
           "resident_bytes": {k: resident_bytes(f, COMPUTE_TYPE[args.engine], 1) for k, f in folders.items()},
           "sets": {s: scored_pair(loaded, models, None, s, r)
                    for s, r in (item.split("=", 1) for item in args.subsets.split(","))}}
    out["speed"] = speed(loaded, models, args)
    for name, scored in out["sets"].items():
        print(f"{name}: BLEU {scored['bleu_delta']:+.2f} (p {scored['p']:.3f}), chrF {scored['chrf_delta']:+.2f} "
              f"(p {scored['chrf_p']:.3f})", flush=True)
    print(f"speed at equal work: {out['speed']['speedup_equal_work']:.3f}x "
          f"({out['speed']['interval']['low']:.3f}-{out['speed']['interval']['high']:.3f}); bytes on disk "
          f"{out['bytes_on_disk']['compressed']:,} against {out['bytes_on_disk']['unpruned']:,}")
    write_json_atomic(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
