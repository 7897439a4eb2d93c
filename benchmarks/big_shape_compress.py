"""`compress` through every stage on a transformer-big-shaped model on this CPU: what each stage costs against the
first line's estimate, the peak memory and the export's parity, for a model of the size users deploy.

The model has the shape of fairseq's WMT'19 En-De transformer-big (`transformer_wmt_en_de_big`: d 1024, FFN 8192, 16
heads, 6+6, shared embeddings) over a 32k joint vocabulary, with random weights (one fairseq-train update at a
learning rate of 1e-9 writes it as a stock checkpoint); the data is synthetic (100k training pairs of 15-35 tokens
drawn from a Zipf distribution over the vocabulary, each target the source's tokens mapped through a fixed
permutation): it measures cost, not BLEU. compress runs with `--budget-updates 50` and options that keep the whole
run to about an hour on one core (the command below; recorded in the run's compress.json), the shape given
(`--shape 16/4x16`: the decoder at 4 of its 6 layers, every head kept), so that the choice times and fits that one
shape instead of searching (its search over the shapes of a transformer-big spent more than 30 CPU minutes in the
closed-form fits' condition numbers, an SVD of each 8192-unit FFN's system, before reconstruct.ridge_condition).

usage: python benchmarks/big_shape_compress.py [--work work/big-shape] [--results results/big-shape-compress]
Resumable: the data, the checkpoint and compress's stages are kept under WORK.
Budget: about 60 CPU minutes on one core (compress's first line says it)."""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
ARCH = ["--arch", "transformer_wmt_en_de_big", "--share-all-embeddings",
        "--encoder-ffn-embed-dim", "8192", "--decoder-ffn-embed-dim", "8192"]
SPLITS = {"train": 100_000, "valid": 300, "test": 200}
VOCAB = 32_000
# what keeps the run to about an hour on one core; every other option at compress's default
COMPRESS = ["--speedup", "1.2", "--shape", "16/4x16", "--engine", "ct2-int8", "--budget-updates", "50", "--beam", "1",
            "--batch-size", "8", "--max-len-a", "1", "--max-len-b", "5", "--timing-sentences", "80", "--runs", "1",
            "--calibration-sentences", "50", "--window-steps", "50", "--check-sentences", "50",
            "--latency-sentences", "5", "--recover-args", "--max-tokens 1024"]


def synthetic_corpus(folder: Path, seed: int = 1) -> None:
    """train/valid/test .de and .en: Zipf-distributed tokens w0..w31999, the target a permutation of them."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(VOCAB)]
    weights = [1.0 / (rank + 1) for rank in range(VOCAB)]
    mapped = words[:]
    rng.shuffle(mapped)
    target_of = dict(zip(words, mapped))
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in SPLITS.items():
        lengths = [rng.randint(15, 35) for _ in range(n)]
        tokens = rng.choices(words, weights=weights, k=sum(lengths))
        source, target, at = [], [], 0
        for length in lengths:
            sentence = tokens[at:at + length]
            at += length
            source.append(" ".join(sentence))
            target.append(" ".join(target_of[w] for w in sentence))
        write_whole(folder / f"{split}.de", "\n".join(source) + "\n")
        write_whole(folder / f"{split}.en", "\n".join(target) + "\n")
    write_whole(folder / "dict.txt", "".join(f"{w} 1\n" for w in words))


def write_whole(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


def run(command: List[str], log: Path) -> None:
    """A command run in LOG's folder (the paths it names relative to it, so that no log names the machine's folders),
    its output appended to LOG; a failure ends the benchmark with the log's tail."""
    here = log.parent.resolve()
    words = [os.path.relpath(c, here) if isinstance(c, Path) else c for c in command]
    with log.open("a", encoding="utf-8") as out:
        out.write("$ " + " ".join(words) + "\n")
        out.flush()
        code = subprocess.run(words, cwd=here, stdout=out, stderr=subprocess.STDOUT).returncode
    if code:
        tail = log.read_text(encoding="utf-8").splitlines()[-15:]
        sys.exit(f"big_shape_compress: {command[0]} failed ({code}):\n" + "\n".join(tail))


def data_bin(work: Path) -> Path:
    raw, out = work / "raw", work / "data-bin"
    if (out / "test.de-en.en.idx").exists():
        return out
    synthetic_corpus(raw)
    run(["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en", "--srcdict", raw / "dict.txt",
         "--tgtdict", raw / "dict.txt", "--trainpref", raw / "train", "--validpref", raw / "valid",
         "--testpref", raw / "test", "--destdir", out, "--workers", "1"], work / "prepare.log")
    shutil.copyfile(raw / "test.en", out / "test.raw.en")
    return out


def random_checkpoint(work: Path, data: Path) -> Path:
    """A stock fairseq checkpoint of the shape: one update at lr 1e-9 from the random initialisation."""
    model = work / "model" / "model.pt"
    if model.exists():
        return model
    run(["fairseq-train", data, *ARCH, "--optimizer", "adam", "--lr", "1e-9", "--max-update", "1",
         "--max-tokens", "512", "--criterion", "label_smoothed_cross_entropy", "--seed", "1",
         "--save-dir", work / "train", "--no-epoch-checkpoints", "--no-save-optimizer-state",
         "--disable-validation", "--no-progress-bar"], work / "prepare.log")
    model.parent.mkdir(exist_ok=True)
    (work / "train" / "checkpoint_last.pt").replace(model)
    return model


def table(record: Dict, wall: float, work: Path) -> str:
    """The benchmark's Markdown: spent against estimated CPU time per stage, peak memory, the export's parity."""
    rows = ["| stage | estimated CPU min | spent CPU min | spent / estimated |", "|---|---|---|---|"]
    for stage, estimate in record["estimated_cpu_seconds"].items():
        spent = record["cpu_seconds"].get(stage)
        ratio = f"{spent / estimate:.2f}" if spent is not None and estimate else "-"
        rows.append(f"| {stage} | {estimate / 60:.1f} | {'-' if spent is None else f'{spent / 60:.1f}'} | {ratio} |")
    total_e, total_s = sum(record["estimated_cpu_seconds"].values()), sum(record["cpu_seconds"].values())
    rows.append(f"| all | {total_e / 60:.1f} | {total_s / 60:.1f} | {total_s / total_e:.2f} |")
    check = json.loads((work / "out" / "stages" / "export" / "stage.json").read_text())["result"]["check"]
    parity = "; ".join(f"{kind}: {check[kind]['differing']} of {check[kind]['sentences']} sentences differ from "
                       f"fairseq's beam (BLEU {check[kind]['bleu_ct2']} against {check[kind]['bleu_fairseq']})"
                       for kind in ("float32", "int8") if kind in check)
    recover = record["stages"]["recover"]
    return "\n".join([
        "# compress on a transformer-big-shaped model, on one CPU core",
        "",
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        f"Command (`benchmarks/big_shape_compress.py`): `fairseq-headprune compress DATA --path model.pt --out OUT "
        f"{' '.join(COMPRESS[:-1])} '{COMPRESS[-1]}'`, `OMP_NUM_THREADS=1`.",
        "",
        *rows,
        "",
        f"Wall time {wall / 60:.1f} min. Peak resident memory: {record['peak_rss_gib']:.1f} GiB (compress), "
        f"{recover.get('peak_rss_gib', float('nan')):.1f} GiB (the recovery: student, teacher and Adam's state). "
        f"The recovery: {recover.get('updates')} updates.",
        "",
        "Export (CTranslate2 against fairseq on the first --check-sentences of valid): " + parity + ".",
        "",
        "The verdict, as the card says it (random weights: the BLEU means nothing here):",
        "",
        *[f"- {line}" for line in record["verdict"]["lines"]],
    ]) + "\n"


def portable(text: str, work: Path) -> str:
    """A log as results/ keeps it: the work folder named WORK and the repository's folder left out of every path
    (the recovery's command names its folders absolutely)."""
    return text.replace(str(work.resolve()) + os.sep, "WORK/").replace(str(ROOT) + os.sep, "")


def write_results(work: Path, results: Path, wall: float) -> None:
    record = json.loads((work / "out" / "compress.json").read_text())
    results.mkdir(parents=True, exist_ok=True)
    write_whole(results / "README.md", table(record, wall, work))
    for source, name in ((work / "dry-run.log", "dry-run.log"), (work / "out" / "MODEL_CARD.md", "MODEL_CARD.md"),
                         (work / "out" / "compress.json", "compress.json")):
        write_whole(results / name, portable(source.read_text(encoding="utf-8"), work))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "work" / "big-shape")
    parser.add_argument("--results", type=Path, default=ROOT / "results" / "big-shape-compress")
    parser.add_argument("--report-only", type=float, metavar="WALL_SECONDS",
                        help="write the results of a finished run again (its wall time given), running nothing")
    args = parser.parse_args(argv)
    if args.report_only is not None:
        write_results(args.work, args.results, args.report_only)
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args.work.mkdir(parents=True, exist_ok=True)
    data = data_bin(args.work)
    model = random_checkpoint(args.work, data)
    base = ["fairseq-headprune", "compress", data, "--path", model, "--out", args.work / "out",
            "--references", data / "test.raw.en", *COMPRESS]
    run([*base, "--dry-run"], args.work / "dry-run.log")
    start = time.time()
    run(base, args.work / "compress.log")
    write_results(args.work, args.results, time.time() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
