"""The recover study on a bundled model: shrink alone and shrink + recover at 25/50/75% of heads removed, after
1, 2 and 4 epochs, against a control (the unpruned model put through the same recovery).

  benchmarks/recover_study.py WORK OUT_DIR --subset valid   # choices: made on Multi30k val, never scored below
  benchmarks/recover_study.py WORK OUT_DIR --subset test    # the table: test2016, decoded once per model
  benchmarks/recover_study.py WORK OUT_DIR --pair en-fr --subset test|mtnt   # recipes/recover_en_fr.sh's runs

WORK holds what recipes/recover_de_en.sh (or recover_en_fr.sh) made: data-bin/ (the sets encoded for the model),
shrink-*.pt and runs/NAME.recover/checkpointN.pt. Every model is decoded with fairseq's generator (beam 5,
sacreBLEU on detokenised output, fairseq_headprune.decoding.evaluate), hypotheses cached by checkpoint hash in
OUT_DIR/hyps/, and compared with the unpruned model by paired bootstrap (fairseq_headprune.stats: 1000
resamples, full size, seed 1). Writes OUT_DIR/recover-SUBSET.{md,json} and, for De-En's test, recover.png (BLEU
against heads removed, with the L0 and from-scratch runs of results/voita/).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import resource
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# run name -> (what it is, the shrink checkpoint it started from, heads removed %)
RUNS = {
    "ctl-logits": ("control: unpruned + recover (logits)", None, 0),
    "r25-logits": ("shrink + recover (logits)", "shrink-25", 25),
    "r50-logits": ("shrink + recover (logits)", "shrink-50", 50),
    "r50-logits-d01": ("shrink + recover (logits, dropout 0.1)", "shrink-50", 50),
    "r50-logits-d01-t2": ("shrink + recover (logits, dropout 0.1, T 2)", "shrink-50", 50),
    "ctl-d01-t2": ("control: unpruned + recover (logits, dropout 0.1, T 2)", None, 0),
    "r75-d01-t2": ("shrink + recover (logits, dropout 0.1, T 2)", "shrink-75", 75),
    "r25-d01-t2": ("shrink + recover (logits, dropout 0.1, T 2)", "shrink-25", 25),
    "rih50-d01-t2": ("Michel's I_h + refit + recover (logits, dropout 0.1, T 2)", "shrink-ih50", 50),
    "rps50-d01-t2": ("shrink per-stack + recover (logits, dropout 0.1, T 2)", "shrink-ps50", 50),
    "r75-logits": ("shrink + recover (logits)", "shrink-75", 75),
    "r50-none": ("shrink + plain fine-tuning", "shrink-50", 50),
    "r50-sequences": ("shrink + recover (sequences)", "shrink-50", 50),
    "rih50-logits": ("Michel's I_h + refit + recover (logits)", "shrink-ih50", 50),
    "rps50-logits": ("shrink per-stack + recover (logits)", "shrink-ps50", 50),
    "r50-seq-d01": ("shrink + recover (sequences, dropout 0.1)", "shrink-50", 50),
    "ctl-seq-d01": ("control: unpruned + recover (sequences, dropout 0.1)", None, 0),
    "rt50-ridge": ("shrink calibrated on train + recover (default recipe)", "shrink-t50-ridge", 50),
    "rt50-w1000-3e-4": ("shrink calibrated on train + window fit + recover (default recipe)",
                        "shrink-t50-w1000-3e-4", 50),
    "rt75-w1000-3e-4": ("shrink calibrated on train + window fit + recover (default recipe)",
                        "shrink-t75-w1000-3e-4", 75),
    "rt30-w1000-3e-4": ("shrink calibrated on train + window fit + recover (default recipe)",
                        "shrink-t30-w1000-3e-4", 30),
    "rt50-both": ("shrink calibrated on train + window fit + recover (both: KL on the teacher's translations)",
                  "shrink-t50-w1000-3e-4", 50),
    "ctl-both": ("control: unpruned + recover (both)", None, 0),
    "rtps50-w1000-3e-4": ("shrink per-stack calibrated on train + window fit + recover (default recipe)",
                          "shrink-tps50-w1000-3e-4", 50),
    "rtdps50-w1000-3e-4": ("shrink per-stack, decoder only (4 of 8 heads), calibrated on train + window fit + "
                           "recover (default recipe)", "shrink-tdps50-w1000-3e-4", 33),
    "rl0-d01-t2": ("Voita's L0 heads (λ 0.01) + refit + recover (logits, dropout 0.1, T 2)", "shrink-l0", 48),
    "rtdps62-w1000-3e-4": ("shrink per-stack, decoder only (3 of 8 heads), calibrated on train + window fit + "
                           "recover (default recipe)", "shrink-tdps62-w1000-3e-4", 42),
    "rtdps62-lr3e-4": ("the same 8/3 shape + recover at lr 3e-4", "shrink-tdps62-w1000-3e-4", 42),
    "ctl-lr3e-4": ("control: unpruned + recover at lr 3e-4", None, 0),
    "rtdps62-h01": ("the same 8/3 shape + recover with the layer distillation (β 0.1)", "shrink-tdps62-w1000-3e-4",
                    42),
}
# recipes whose control was not run (compared with the default recipe's run from the same shrink instead)
NO_CONTROL = {"rtdps62-h01"}
FIRST_RECIPE = {"ctl-logits", "r25-logits", "r50-logits", "r75-logits", "rih50-logits", "rps50-logits", "r50-none"}
SHRINKS = {"shrink-25": 25, "shrink-50": 50, "shrink-75": 75, "shrink-ih50": 50, "shrink-ps50": 50,
           "shrink-t50-ridge": 50, "shrink-t50-w300-3e-5": 50, "shrink-t50-w300-1e-4": 50,
           "shrink-t50-w300-3e-4": 50, "shrink-t50-w1000-1e-4": 50, "shrink-t50-w300-1e-3": 50,
           "shrink-t50-w1000-3e-4": 50, "shrink-t75-ridge": 75, "shrink-t75-w1000-3e-4": 75,
           "shrink-t30-w1000-3e-4": 30, "shrink-tps50-w1000-3e-4": 50, "shrink-tdps50-w1000-3e-4": 33,
           "shrink-tdps62-w1000-3e-4": 42, "shrink-l0": 48}
SHRINK_LABEL = {"shrink-ih50": "Michel's I_h + refit", "shrink-l0": "Voita's L0 heads (λ 0.01, 69 closed) + refit",
                "shrink-ps50": "shrink per-stack",
                "shrink-t50-ridge": "shrink calibrated on train, closed-form fits",
                "shrink-t50-w300-3e-5": "shrink calibrated on train + window fit (300 steps, lr 3e-5)",
                "shrink-t50-w300-1e-4": "shrink calibrated on train + window fit (300 steps, lr 1e-4)",
                "shrink-t50-w300-3e-4": "shrink calibrated on train + window fit (300 steps, lr 3e-4)",
                "shrink-t50-w1000-1e-4": "shrink calibrated on train + window fit (1000 steps, lr 1e-4)",
                "shrink-t50-w300-1e-3": "shrink calibrated on train + window fit (300 steps, lr 1e-3)",
                "shrink-t50-w1000-3e-4": "shrink calibrated on train + window fit (1000 steps, lr 3e-4)",
                "shrink-t75-ridge": "shrink calibrated on train, closed-form fits",
                "shrink-t75-w1000-3e-4": "shrink calibrated on train + window fit (1000 steps, lr 3e-4)",
                "shrink-t30-w1000-3e-4": "shrink calibrated on train + window fit (1000 steps, lr 3e-4)",
                "shrink-tps50-w1000-3e-4": "shrink per-stack calibrated on train + window fit",
                "shrink-tdps50-w1000-3e-4": "shrink per-stack, decoder only, calibrated on train + window fit",
                "shrink-tdps62-w1000-3e-4": "shrink per-stack, decoder only (3 of 8), calibrated on train + window fit"}
# variants compared on valid only (a choice); test2016 decodes the chosen one and what it is compared with
CHOICE_ONLY = {"shrink-t50-w300-3e-5", "shrink-t50-w300-1e-4", "shrink-t50-w300-3e-4", "shrink-t50-w1000-1e-4",
               "shrink-t50-w300-1e-3"}


def control_of(run: Optional[str]) -> Optional[str]:
    """The control run of a run's recipe: the unpruned model put through the same recovery (None: not run)."""
    if run in NO_CONTROL:
        return None
    if run in FIRST_RECIPE:
        return "ctl-logits"
    if run == "rtdps62-lr3e-4":
        return "ctl-lr3e-4"
    if run and run.startswith("ctl-"):  # a control is its own
        return run
    if run == "rt50-both":
        return "ctl-both"
    return "ctl-seq-d01" if run and run.startswith("r50-seq") else "ctl-d01-t2"


@dataclass
class Pair:
    """One model's study: its checkpoint folder, languages, runs and how its sets are decoded."""

    model_dir: str
    src: str
    tgt: str
    runs: Dict[str, tuple]
    shrinks: Dict[str, int]
    shrink_labels: Dict[str, str]
    control_of: Callable[[Optional[str]], Optional[str]]
    subsets: Tuple[str, ...]
    scored: Tuple[str, ...]  # the subsets of the table (the others only chose)
    generation: Tuple[str, ...] = ()
    choice_only: frozenset = frozenset()

    @property
    def model(self) -> str:
        return os.path.join(ROOT, self.model_dir, "model.pt")


PAIRS = {
    "de-en": Pair("checkpoints/de-en", "de", "en", RUNS, SHRINKS, SHRINK_LABEL, control_of, ("valid", "test"),
                  ("test",), choice_only=frozenset(CHOICE_ONLY)),
    # recipes/recover_en_fr.sh: newstest2014's first 1000 sentences (test) and MTNT's En-Fr test set (mtnt)
    "en-fr": Pair("checkpoints/en-fr", "en", "fr",
                  {"r50": ("shrink + recover (default recipe)", "shrink-50", 50),
                   "ctl": ("control: unpruned + recover (default recipe)", None, 0),
                   "rdps50-w1000": ("shrink per-stack, decoder only (4 of 8 heads) + window fit + recover (default "
                                    "recipe)", "shrink-dps50-w1000", 33)},
                  {"shrink-50": 50, "shrink-dps50-w1000": 33},
                  {"shrink-dps50-w1000": "shrink per-stack, decoder only (4 of 8 heads) + window fit"},
                  lambda run: "ctl", ("test", "mtnt"), ("test", "mtnt"),
                  ("--max-len-a", "1.5", "--max-len-b", "10")),
}


def models(pair: Pair, work: str, subset: str):
    """(key, label, removed %, run, epoch, checkpoint) of every model present, the unpruned one first."""
    out = [("unpruned", "unpruned", 0, None, None, pair.model)]
    for name, removed in pair.shrinks.items():
        path = os.path.join(work, name + ".pt")
        if os.path.exists(path) and not (subset in pair.scored and name in pair.choice_only):
            out.append((name, pair.shrink_labels.get(name, "shrink alone"), removed, name, 0, path))
    for run, (label, _, removed) in pair.runs.items():
        found = glob.glob(os.path.join(work, "runs", run + ".recover", "checkpoint[0-9]*.pt"))
        for epoch, path in sorted((int(os.path.basename(p)[10:-3]), p) for p in found):
            out.append((f"{run}@{epoch}", label, removed, run, epoch, path))
    return out


def translate(pair: Pair, checkpoint: str, work: str, subset: str, cache: str):
    """Detokenised beam-5 hypotheses of the subset, cached by the checkpoint's hash."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_headprune.decoding.evaluate import SubsetEvaluator
    from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR, load
    from fairseq_headprune.records.identity import file_sha256
    from fairseq_headprune.records.log import atomic_output

    path = os.path.join(cache, f"{file_sha256(checkpoint, 16)}-{subset}.txt")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return f.read().split("\n")[:-1], 0.0
    argv = [os.path.join(work, "data-bin"), "--path", checkpoint, "--user-dir", PACKAGE_DIR, "-s", pair.src,
            "-t", pair.tgt, "--gen-subset", subset, "--beam", "5", "--max-tokens", "6000", "--bpe", "subword_nmt",
            "--bpe-codes", os.path.join(ROOT, pair.model_dir, "code"), "--tokenizer", "moses", *pair.generation]
    parser = options.get_generation_parser(default_task="translation_headprune")
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, input_args=argv))
    start = time.perf_counter()
    evaluator = SubsetEvaluator(load(cfg), subset, os.path.join(work, "data-bin", f"{subset}.raw.{pair.tgt}"))
    hyps = evaluator.translate()
    seconds = time.perf_counter() - start
    with atomic_output(path) as f:
        f.write("".join(h + "\n" for h in hyps))
    return hyps, seconds


def run_costs(work: str, run: str) -> dict:
    """Wall time and peak memory of a recover run (its /usr/bin/time -v log), updates, valid loss per epoch."""
    costs = {}
    log = os.path.join(work, "runs", run + ".log")
    if os.path.exists(log):
        text = open(log, encoding="utf-8", errors="replace").read()
        # a run extended by later calls appends to its log: peak over the calls, wall time summed
        peaks = re.findall(r"Maximum resident set size \(kbytes\): (\d+)", text)
        if peaks:
            costs["peak_rss_gib"] = round(max(int(k) for k in peaks) / 2**20, 2)
        walls = re.findall(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
        if walls:
            seconds = [sum(float(v) * 60 ** i for i, v in enumerate(reversed(w.split(":")))) for w in walls]
            costs["wall_minutes"] = round(sum(seconds) / 60, 1)
            costs["calls"] = len(walls)
        cpu = re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", text)
        if cpu:
            costs["cpu_minutes"] = round(sum(float(c) for c in cpu) / 60, 1)
    record = os.path.join(work, "runs", run + ".json")
    if not os.path.exists(record):  # the first runs of the study wrote OUT.pt.json
        record = os.path.join(work, "runs", run + ".pt.json")
    if os.path.exists(record):
        r = json.load(open(record))
        costs.update(updates=r.get("updates"), epochs=r.get("epochs"), best=r.get("best_checkpoint"))
    return costs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("work")
    p.add_argument("out")
    p.add_argument("--subset", required=True, help="valid or test (de-en); test or mtnt (en-fr)")
    p.add_argument("--pair", choices=tuple(PAIRS), default="de-en")
    args = p.parse_args()
    pair = PAIRS[args.pair]
    if args.subset not in pair.subsets:
        p.error(f"--subset of {args.pair}: one of {', '.join(pair.subsets)}")
    import sacrebleu

    from fairseq_headprune.stats import BleuBootstrap
    from fairseq_headprune.studies import recover_table

    os.makedirs(os.path.join(args.out, "hyps"), exist_ok=True)
    refs = open(os.path.join(args.work, "data-bin", f"{args.subset}.raw.{pair.tgt}"),
                encoding="utf-8").read().split("\n")[:-1]
    rows, boot = [], None
    for key, label, removed, run, epoch, ckpt in models(pair, args.work, args.subset):
        hyps, seconds = translate(pair, ckpt, args.work, args.subset, os.path.join(args.out, "hyps"))
        bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
        row = {"key": key, "label": label, "removed_percent": removed, "run": run, "epoch": epoch, "bleu": bleu}
        if boot is None:
            boot, base = BleuBootstrap(refs, hyps, samples=1000, seed=1, sample_ratio=1.0), bleu
        else:
            test = boot.test(hyps)
            low, high = boot.difference_interval(hyps)
            row.update(delta=bleu - base, p=test.p_value, interval=[low, high])
        rows.append(row)
        print(f"{key:<22} {bleu:6.2f} {row.get('delta', 0):+6.2f} p={row.get('p', float('nan')):.3f} "
              f"({seconds:.0f}s)", flush=True)
    for r in rows:  # each recovery against the control of its own recipe, after as many epochs
        control = pair.control_of(r["run"])
        match = [c for c in rows if c["run"] == control and c["epoch"] == r["epoch"]]
        if r["run"] in pair.runs and control != r["run"] and match:
            r["control_delta"] = match[0]["delta"]
            r["delta_adjusted"] = r["delta"] - match[0]["delta"]
    costs = {run: run_costs(args.work, run) for run in pair.runs}
    for run, c in costs.items():  # the cost target is recover's, with its own defaults
        c["default_recipe"] = ((control_of(run) == "ctl-d01-t2" and run != "ctl-d01-t2" and run not in FIRST_RECIPE)
                               if args.pair == "de-en" else run != pair.control_of(run))
    from fairseq_headprune.records.identity import file_sha256

    settings = ("paired bootstrap: 1000 resamples of full size (sample ratio 1.0), seed 1, one-sided p in the "
                "observed direction; beam 5; sacreBLEU " + sacrebleu.__version__ + " on detokenised output")
    result = {"subset": args.subset, "settings": settings, "unpruned_sha256": file_sha256(pair.model), "rows": rows,
              "costs": costs, "figure": "recover.png" if (args.pair, args.subset) == ("de-en", "test") else None,
              "pair": args.pair,
              "peak_rss_gib_of_this_script": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}
    from fairseq_headprune.records.log import atomic_output, write_json_atomic

    write_json_atomic(os.path.join(args.out, f"recover-{args.subset}.json"), result)
    with atomic_output(os.path.join(args.out, f"recover-{args.subset}.md")) as f:
        f.write(recover_table.markdown(result))
    if result["figure"]:
        plot(rows, os.path.join(args.out, "recover.png"))
    print(recover_table.markdown(result))


def plot(rows, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(13, 5.5))
    base = next(r["bleu"] for r in rows if r["key"] == "unpruned")
    ax.axhline(base, color="black", lw=0.8, ls=":", label="unpruned")
    series = {}
    for r in rows:
        if r["run"] in FIRST_RECIPE or r["run"] == "r50-logits-d01":  # superseded recipes: in the tables only
            continue
        name = r["label"] + ("" if r["epoch"] in (0, None) else f", {r['epoch']} ep")
        series.setdefault(name, []).append((r["removed_percent"], r["bleu"]))
    named = [(name, points) for name, points in series.items() if name != "unpruned"]
    for i, (name, points) in enumerate(named):  # tab20: one colour per series (the default cycle repeats at 10)
        points.sort()
        ax.plot(*zip(*points), marker="os^Dv"[i % 5], ms=4, color=plt.cm.tab20(i % 20), label=name)
    voita = os.path.join(ROOT, "results/voita/compare.jsonl")
    l0 = []
    for line in open(voita, encoding="utf-8"):
        r = json.loads(line)
        if r.get("method") == "l0" and r.get("l0_lambda"):
            l0.append((100 * (1 - r["heads_kept"] / 144), r["bleu"]))
    if l0:
        ax.plot(*zip(*sorted(l0)), marker="s", ls="--", color="grey", label="Voita L0 gates (300 updates)")
    scratch = []
    for folder in glob.glob(os.path.join(ROOT, "results/voita/from-scratch/*/")):
        if os.path.exists(folder + "bleu.txt") and os.path.exists(folder + "kept-heads.json"):
            kept = json.load(open(folder + "kept-heads.json"))
            # layers not listed keep all 8 heads (the kept_heads convention)
            n = sum(len(kept.get(t, {}).get(str(layer), range(8))) for t in ("enc-self", "enc-dec", "dec-self")
                    for layer in range(1, 7))
            scratch.append((100 * (1 - n / 144), float(open(folder + "bleu.txt").read().split("\t")[2])))
    if scratch:
        ax.plot(*zip(*sorted(scratch)), marker="^", ls="none", color="brown",
                label="L0's shape trained from scratch (25 ep)")
    ax.set_xlabel("heads removed (%)")
    ax.set_ylabel("BLEU, Multi30k test2016")
    ax.set_ylim(bottom=max(0, min(b for _, b in sum(series.values(), [])) - 2))
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=130)


if __name__ == "__main__":
    main()
