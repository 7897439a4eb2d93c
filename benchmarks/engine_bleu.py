"""BLEU of other checkpoints against the unpruned model in one engine, scored as `compress` reports (the same
function: compress.stages.report.scored_pair): for controls (the unpruned model through a recovery with nothing removed)
beside a compressed model's record.

  python benchmarks/engine_bleu.py DATA --path UNPRUNED.pt --other ctl-e4=CKPT [--other ...] \
      --subsets test=REFS,val500=REFS --engine ct2-int8 --out OUT.json [--note TEXT] [fairseq decoding options]

Writes OUT.json: {name: {subset: scored_pair's record}} with the decoding and significance settings, the paths as
given (run it from the project root with relative ones: the file is committed) and --note (what the controls are).
"""
from __future__ import annotations

import os
import sys
import tempfile
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)  # a PYTHONPATH snapshot of the package, when given, stays first


def add_args(parser) -> None:
    group = parser.add_argument_group("engine_bleu")
    group.add_argument("--other", action="append", required=True, metavar="NAME=CHECKPOINT")
    group.add_argument("--subsets", required=True, metavar="SUBSET=REFERENCES[,...]")
    group.add_argument("--engine", default="ct2-int8")
    group.add_argument("--out", required=True)
    group.add_argument("--note", default="", help="what the models are, written into OUT.json")


def main(argv) -> int:
    from fairseq_headprune.cli import _quiet_dependencies, parse
    from fairseq_headprune.compress.stages.report import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED, scored_pair
    from fairseq_headprune.engines.engine_model import EngineModel
    from fairseq_headprune.fairseq_io.loading import load, load_other, trust_fairseq_checkpoints
    from fairseq_headprune.records.identity import decoding_identity
    from fairseq_headprune.records.log import write_json_atomic

    trust_fairseq_checkpoints()
    _quiet_dependencies()
    cfg, args = parse("engine_bleu", SimpleNamespace(add_args=add_args), argv)
    subsets = [item.split("=", 1) for item in args.subsets.split(",")]
    unpruned = load(cfg)
    out = {"engine": args.engine, "decoding": decoding_identity(cfg), "unpruned": cfg.common_eval.path,
           "significance": f"paired bootstrap of sacreBLEU against the unpruned model in {args.engine} "
                           f"({BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}, one-sided)", "models": {}}
    with tempfile.TemporaryDirectory(prefix="engine-bleu-") as tmp:
        base = EngineModel(unpruned, args.engine, folder=os.path.join(tmp, "unpruned"))
        for i, item in enumerate(args.other):
            name, path = item.split("=", 1)
            other = load_other(unpruned, path)
            models = {"unpruned": base,
                      "compressed": EngineModel(other, args.engine, folder=os.path.join(tmp, f"m{i}"))}
            out["models"][name] = {"checkpoint": path,
                                   **{s: scored_pair(unpruned, models, None, s, r) for s, r in subsets}}
            print(name, {s: out["models"][name][s]["bleu_delta"] for s, _ in subsets}, flush=True)
    if args.note:
        out["note"] = args.note
    write_json_atomic(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
