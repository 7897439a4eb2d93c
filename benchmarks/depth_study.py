"""The depth study's BLEU table (recipes/depth_de_en.sh): whole decoder layers removed, with and without
heads, shrink alone and recovered, against the unpruned De-En model.

  benchmarks/depth_study.py WORK OUT_DIR --subset valid            # every shrink and recover epoch: the choices
  benchmarks/depth_study.py WORK OUT_DIR --subset test --final     # test2016: the unpruned and final models, once
  benchmarks/depth_study.py WORK OUT_DIR --subset heldout --final  # the last 1000 Multi30k train sentences (held out)

WORK holds what the recipe made: data-bin/, shrink-NAME.pt (+ .json), runs/NAME.pt (the recovered model: its
lowest valid loss epoch) and runs/NAME.recover/checkpointN.pt. Decoding, BLEU and significance as
benchmarks/recover_study.py (beam 5, sacreBLEU on detokenised output, paired bootstrap of fairseq_headprune.stats:
1000 full-size resamples, seed 1), hypotheses cached by checkpoint hash in OUT_DIR/hyps/. Writes
OUT_DIR/depth-SUBSET.{json,md}.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
if ROOT not in sys.path:
    sys.path.append(ROOT)  # a PYTHONPATH snapshot of the package, when given, stays first


def shape_of(record_path: str) -> str:
    """'decoder L x H' of a shrink (its JSON record), e.g. 'dec 3 layers [1, 4, 6], 3/8 heads'."""
    if not os.path.exists(record_path):
        return ""
    r = json.load(open(record_path))
    layers = (r.get("layers") or {}).get("kept", {})
    parts = [f"{s} layers {v}" for s, v in sorted(layers.items())]
    kept = r.get("kept_heads") or {}
    for t in ("dec-self", "enc-dec", "enc-self"):
        if t in kept:
            counts = sorted({len(v) for v in kept[t].values()})
            parts.append(f"{t} {'/'.join(map(str, counts))} heads")
    ffn = r.get("ffn_kept") or {}
    if ffn:
        parts.append("FFN " + "/".join(map(str, sorted({n for v in ffn.values() for n in v.values()}))) + " units")
    return "; ".join(parts) or "unpruned shape"


def models(work: str, final: bool):
    """(key, what, checkpoint, shrink record): the unpruned model, then shrinks and recover epochs (valid), or the
    final recovered models only (final)."""
    from recover_study import PAIRS

    out = [("unpruned", "unpruned", PAIRS["de-en"].model, None)]
    if not final:
        for path in sorted(glob.glob(os.path.join(work, "shrink-*.pt"))):
            name = os.path.basename(path)[:-3]
            out.append((name, "shrink alone", path, path[:-3] + ".json"))
    for path in sorted(glob.glob(os.path.join(work, "runs", "*.pt"))):
        name = os.path.basename(path)[:-3]
        record = json.load(open(path[:-3] + ".json")) if os.path.exists(path[:-3] + ".json") else {}
        student = record.get("student", "")
        shrink_record = student[:-3] + ".json" if student.endswith(".pt") else None
        if not final:
            for epoch_path in sorted(glob.glob(os.path.join(work, "runs", name + ".recover", "checkpoint[0-9]*.pt")),
                                     key=lambda p: int(os.path.basename(p)[10:-3])):
                epoch = os.path.basename(epoch_path)[10:-3]
                out.append((f"{name}@{epoch}", "recover epoch", epoch_path, shrink_record))
        out.append((name, f"recovered (lowest valid loss at update {record.get('updates_at_best', '?')} of "
                          f"{record.get('updates', '?')})", path, shrink_record))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("work")
    p.add_argument("out")
    p.add_argument("--subset", required=True, choices=("valid", "test", "heldout", "bible"))
    p.add_argument("--final", action="store_true", help="the unpruned and final recovered models only")
    args = p.parse_args()
    if args.subset != "valid" and not args.final:  # test, heldout, bible (an out-of-domain set the teacher never saw)
        p.error("test and heldout are decoded once, with the final models: give --final")
    import sacrebleu

    from recover_study import PAIRS, translate
    from fairseq_headprune.records.log import atomic_output, write_json_atomic
    from fairseq_headprune.stats import BleuBootstrap

    pair = PAIRS["de-en"]
    os.makedirs(os.path.join(args.out, "hyps"), exist_ok=True)
    refs = open(os.path.join(args.work, "data-bin", f"{args.subset}.raw.en"), encoding="utf-8").read().split("\n")[:-1]
    rows, boot, base, hyps_of = [], None, None, {}
    for key, what, ckpt, record in models(args.work, args.final):
        hyps, seconds = translate(pair, ckpt, args.work, args.subset, os.path.join(args.out, "hyps"))
        bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
        hyps_of[key] = hyps
        row = {"key": key, "what": what, "shape": shape_of(record) if record else "", "bleu": bleu,
               "checkpoint": os.path.relpath(ckpt, ROOT)}
        if boot is None:
            boot, base = BleuBootstrap(refs, hyps, samples=1000, seed=1, sample_ratio=1.0), bleu
        else:
            test = boot.test(hyps)
            low, high = boot.difference_interval(hyps)
            row.update(delta=bleu - base, p=test.p_value, interval=[low, high])
        rows.append(row)
        print(f"{key:<28} {bleu:6.2f} {row.get('delta', 0):+6.2f} p={row.get('p', float('nan')):.3f} "
              f"({seconds:.0f}s) {row['shape']}", flush=True)
    settings = ("paired bootstrap: 1000 resamples of full size (sample ratio 1.0), seed 1, one-sided p in the "
                "observed direction; 95% interval of the difference; beam 5; sacreBLEU " + sacrebleu.__version__ +
                " on detokenised output")
    rules = []  # the layer selection rules against each other: shrink-NAME-importance against shrink-NAME-even
    for key in sorted(k for k in hyps_of if k.startswith("shrink-") and k.endswith("-importance")):
        even = key[: -len("importance")] + "even"
        if even in hyps_of:
            pair = BleuBootstrap(refs, hyps_of[even], samples=1000, seed=1, sample_ratio=1.0)
            low, high = pair.difference_interval(hyps_of[key])
            rules.append({"importance": key, "even": even, "p": pair.test(hyps_of[key]).p_value,
                          "delta": sacrebleu.corpus_bleu(hyps_of[key], [refs]).score
                          - sacrebleu.corpus_bleu(hyps_of[even], [refs]).score, "interval": [low, high]})
    result = {"subset": args.subset, "settings": settings, "rows": rows, "selection_rules": rules}
    write_json_atomic(os.path.join(args.out, f"depth-{args.subset}.json"), result)
    lines = [f"# {args.subset}: BLEU against the unpruned model", "", settings, "",
             "| model | what | shape | BLEU | Δ | p | 95% interval of Δ |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        iv = f"[{r['interval'][0]:+.2f}, {r['interval'][1]:+.2f}]" if "interval" in r else ""
        delta = f"{r['delta']:+.2f}" if "delta" in r else ""
        pv = f"{r['p']:.3f}" if "p" in r else ""
        lines.append(f"| {r['key']} | {r['what']} | {r['shape']} | {r['bleu']:.2f} | {delta} | {pv} | {iv} |")
    if rules:
        lines += ["", "Layer selection: greedy calibration loss (importance) against evenly spaced layers (even), "
                  "same bootstrap with the even model as baseline", "",
                  "| importance | even | Δ BLEU | p | 95% interval |", "|---|---|---|---|---|"]
        lines += [f"| {r['importance']} | {r['even']} | {r['delta']:+.2f} | {r['p']:.3f} | "
                  f"[{r['interval'][0]:+.2f}, {r['interval'][1]:+.2f}] |" for r in rules]
    with atomic_output(os.path.join(args.out, f"depth-{args.subset}.md")) as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
