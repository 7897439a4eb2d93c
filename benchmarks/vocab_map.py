"""What a vocabulary map (compress.vocab_map, `export-ct2 --vocab-map`) buys and costs on one model in CTranslate2
int8: BLEU on a subset no table reports (with its paired-bootstrap p against the same model without the map), and
speed at equal work (forced lengths, interleaved, paired per batch) at the decoding's batch size and at batch 1.

  python benchmarks/vocab_map.py DATA --path MODEL.pt --subset valid --references REFS --maps 100:500,50:300 \
      --out OUT.json [fairseq decoding options: --beam 5 --batch-size 64 --tokenizer moses --bpe ...]

The maps are built from DATA's train pairs (K:N: each source token's K most co-occurring target tokens, the N most
frequent always). Writes OUT.json and prints one line per map.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)  # a PYTHONPATH snapshot of the package, when given, stays first


def add_args(parser) -> None:
    group = parser.add_argument_group("vocab_map")
    group.add_argument("--subset", default="valid", help="the sentences decoded (never a reported test set)")
    group.add_argument("--references", required=True)
    group.add_argument("--maps", default="100:500", metavar="K:N[,K:N...]")
    group.add_argument("--runs", type=int, default=3, help="interleaved timing rounds")
    group.add_argument("--batch1-sentences", type=int, default=100, help="sentences timed one at a time")
    group.add_argument("--out", required=True)


def timed(models, samples, runs: int):
    """Equal-work speed-up of every model over `plain` (forced to the mean length of plain's own hypotheses)."""
    from fairseq_headprune.engines import timing

    natural = models["plain"].run(samples)
    length = max(1, round(statistics.mean(len(h) for h in natural["hypotheses"].values())))
    seconds = timing.timed_rounds({k: m.run for k, m in models.items()}, samples, runs, length)
    return {k: round(timing.paired_speedup(seconds["plain"], v), 3) for k, v in seconds.items() if k != "plain"}, \
        {"batches": len(samples), "forced_length": length, "runs": runs}


def main(argv) -> int:
    from fairseq_headprune.cli import _quiet_dependencies, parse
    from fairseq_headprune.compress.stages.report import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED, scored_pair
    from fairseq_headprune.engines import timing
    from fairseq_headprune.engines.ct2_spec import build_spec, vocabulary, write_model
    from fairseq_headprune.engines.engine_model import EngineModel
    from fairseq_headprune.engines.fairseq_engine import check_batches
    from fairseq_headprune.prune.vocab_map import VocabMapOptions, build_vmap
    from fairseq_headprune.fairseq_io.loading import load, trust_fairseq_checkpoints
    from fairseq_headprune.records.identity import decoding_identity
    from fairseq_headprune.records.log import write_json_atomic

    trust_fairseq_checkpoints()
    _quiet_dependencies()
    cfg, args = parse("vocab_map", SimpleNamespace(add_args=add_args), argv)
    loaded = load(cfg)
    task_cfg, src_dict, tgt_dict = loaded.task.cfg, loaded.task.source_dictionary, loaded.task.target_dictionary
    data = str(task_cfg.data).split(os.pathsep)[0]
    activation = getattr(loaded.saved_cfg.model, "activation_fn", None) or "relu"
    maps = [tuple(int(x) for x in item.split(":")) for item in args.maps.split(",")]
    out = {"engine": "ct2-int8", "subset": args.subset, "decoding": decoding_identity(cfg),
           "significance": f"paired bootstrap of sacreBLEU against the same model without a map "
                           f"({BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}, one-sided)", "maps": {}}
    with tempfile.TemporaryDirectory(prefix="vocab-map-") as tmp:
        folders = {"plain": os.path.join(tmp, "plain")}
        write_model(build_spec(loaded.model, src_dict, tgt_dict, activation), folders["plain"], "int8")
        for k, n in maps:
            name, vmap = f"{k}:{n}", os.path.join(tmp, f"vmap-{k}-{n}.txt")
            options = VocabMapOptions(vocab_map_per_source=k, vocab_map_frequent=n)
            stats = build_vmap(vmap, [(data, "train", task_cfg.source_lang, task_cfg.target_lang)],
                               vocabulary(src_dict), vocabulary(tgt_dict), [src_dict.pad(), src_dict.eos(),
                                                                             src_dict.bos()], options)
            folders[name] = os.path.join(tmp, f"map-{k}-{n}")
            write_model(build_spec(loaded.model, src_dict, tgt_dict, activation), folders[name], "int8", vmap)
            out["maps"][name] = {"map": stats}
        models = {k: EngineModel(loaded, "ct2-int8", ct2_folder=f) for k, f in folders.items()}
        for name in out["maps"]:
            pair = {"unpruned": models["plain"], "compressed": models[name]}
            out["maps"][name]["bleu"] = scored_pair(loaded, pair, None, args.subset, args.references)
        samples = check_batches(loaded, args.subset, 10 ** 9)
        speed, out["timing"] = timed(models, samples, args.runs)
        batch_size = loaded.cfg.dataset.batch_size
        loaded.cfg.dataset.batch_size = 1
        try:
            single = check_batches(loaded, args.subset, args.batch1_sentences)
        finally:
            loaded.cfg.dataset.batch_size = batch_size
        speed1, out["timing_batch1"] = timed(models, single, args.runs)
        out["load_average"] = timing.load_average()
    for name, row in out["maps"].items():
        row["speedup_equal_work"], row["speedup_equal_work_batch1"] = speed[name], speed1[name]
        b = row["bleu"]
        print(f"map {name}: BLEU {b['bleu_unpruned']:.2f} -> {b['bleu_compressed']:.2f} ({b['bleu_delta']:+.2f}, "
              f"p {b['p']:.3f}); {speed[name]:.3f}x at batch {batch_size}, {speed1[name]:.3f}x at batch 1",
              flush=True)
    write_json_atomic(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
