"""The cost table of `compress` (fairseq_headprune.prune.levers) on the shapes of released fairseq translation
models, randomly initialised: which lever buys what at which size, in CTranslate2 int8, one thread, batch 64 and
batch 1.

Speed needs no trained weights: a model's decoding time at equal work (every hypothesis forced to the same length)
depends on its shape, not on what its weights say, so a random model of a released checkpoint's shape times as the
checkpoint would. Each row is one lever at one value, the others whole (core.surgery.crude_model: the first
heads of every layer, the first FFN units, the first target words), timed against the unpruned model of the same
shape, the two interleaved batch by batch (each pair decoded one right after the other, in a random order per
batch; the unpruned model is timed beside every row, so only two models are in memory at a time). Speed-up: the
median over batches and rounds of the paired ratios; FLOP ratio from core.flops for the same work.

  python benchmarks/shape_cost_table.py results/shape-cost-table [--shapes opus-mt-base,wmt14-en-fr-big,...]
      [--runs 2] [--length 15] [--batch1-sentences 8]

Writes OUT/shape-cost-table.json and OUT/README.md (and prints the table). Sources are random word ids,
15 to 25 tokens; the forced length is --length. Shapes already in OUT's table and not named by --shapes are kept
as they were measured (each with its own date and settings), and so is README.md's hand-written part from its
"## Reading it" heading on.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import sys
import tempfile
import time
from argparse import Namespace
from typing import Dict, List

import torch

# name: (d, ffn, heads, encoder layers, decoder layers, vocabulary, what it stands for)
SHAPES = {
    "opus-mt-base": (512, 2048, 8, 6, 6, 58000, "OPUS-MT (Marian base, converted): d 512, FFN 2048, 8 heads, 6+6"),
    "wmt14-en-fr-big": (1024, 4096, 16, 6, 6, 40000,
                        "fairseq WMT'14 En-Fr transformer-big: d 1024, FFN 4096, 16 heads, 6+6"),
    "wmt19-en-de-big": (1024, 8192, 16, 6, 6, 42000,
                        "fairseq WMT'19 En-De transformer-big: d 1024, FFN 8192, 16 heads, 6+6"),
    "m2m100-418m": (1024, 4096, 16, 12, 12, 128112, "M2M-100 418M (dense): d 1024, FFN 4096, 16 heads, 12+12"),
    "nllb-200-600m": (1024, 4096, 16, 12, 12, 256206,
                      "NLLB-200 distilled 600M (dense): d 1024, FFN 4096, 16 heads, 12+12"),
}
# the output layer trimmed to what one language pair uses (shrink --keep-vocab), for the multilingual shapes: about
# 32k target words, the 20-40k a pair's text of a few million sentences is assumed to use (docs/vocabulary.md). An
# assumption, not a measurement: the releases' SentencePiece models and data cannot be had here.
PAIR_WORDS = 32000
PAIR_SHARE = {name: round(100.0 * PAIR_WORDS / SHAPES[name][5], 1) for name in ("m2m100-418m", "nllb-200-600m")}


def levers_for_benchmark(name: str):
    """The rows of a shape: each lever at half (heads also at a quarter), the output layer also at one pair's
    share (PAIR_SHARE) for a multilingual shape."""
    from fairseq_headprune.prune.levers import Lever

    pair = (PAIR_SHARE[name],) if name in PAIR_SHARE else ()
    return (Lever("encoder heads", "enc_heads", "heads kept in every encoder layer", True, (50.0, 25.0)),
            Lever("decoder heads", "dec_heads", "heads kept in every decoder self- and cross-attention layer", True,
                  (50.0, 25.0)),
            Lever("decoder layers", "dec_layers", "decoder layers kept", True, (50.0,)),
            Lever("FFN units", "ffn_percent", "% of every FFN's hidden units kept", True, (50.0,)),
            Lever("output layer", "vocab_percent", "% of the target words kept", True, (50.0, *pair)))


class _Task:
    def __init__(self, dictionary):
        self.source_dictionary = self.target_dictionary = dictionary


def random_loaded(name: str, beam: int):
    """A randomly initialised fairseq transformer of the shape, as compress's timing code takes a loaded model."""
    from fairseq.data import Dictionary
    from fairseq.dataclass.configs import GenerationConfig
    from fairseq.models.transformer import TransformerModel, base_architecture

    from fairseq_headprune.fairseq_io.loading import Loaded

    d, ffn, heads, enc, dec, vocab, _ = SHAPES[name]
    dictionary = Dictionary()
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    args = Namespace(encoder_embed_dim=d, decoder_embed_dim=d, encoder_ffn_embed_dim=ffn, decoder_ffn_embed_dim=ffn,
                     encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_layers=enc,
                     decoder_layers=dec, share_all_embeddings=True, max_source_positions=1024,
                     max_target_positions=1024)
    base_architecture(args)
    torch.manual_seed(0)
    model = TransformerModel.build_model(args, _Task(dictionary)).eval()
    generation = GenerationConfig()
    generation.beam = beam
    cfg = Namespace(generation=generation, dataset=Namespace(max_tokens=None, batch_size=64))
    return Loaded(cfg, _Task(dictionary), model, Namespace(model=Namespace(activation_fn="relu")), name)


def random_batches(dictionary, sentences: int, batch: int, seed: int = 1) -> List[Dict]:
    rng = random.Random(seed)
    out = []
    for start in range(0, sentences, batch):
        rows = [[rng.randrange(dictionary.nspecial, len(dictionary)) for _ in range(rng.randint(15, 25))]
                + [dictionary.eos()] for _ in range(min(batch, sentences - start))]
        width = max(len(r) for r in rows)
        tokens = torch.full((len(rows), width), dictionary.pad(), dtype=torch.long)
        for i, r in enumerate(rows):
            tokens[i, width - len(r):] = torch.tensor(r)  # left-padded sources, as fairseq batches them
        out.append({"id": torch.arange(start, start + len(rows)),
                    "net_input": {"src_tokens": tokens, "src_lengths": torch.tensor([len(r) for r in rows])}})
    return out


def measure_shape(name: str, runs: int, length: int, batch1_sentences: int, log=print) -> Dict:
    from fairseq_headprune.prune import levers
    from fairseq_headprune.core import flops
    from fairseq_headprune.core.shape import Shape
    from fairseq_headprune.core.surgery import crude_model
    from fairseq_headprune.engines import timing
    from fairseq_headprune.engines.ct2 import ct2_shape
    from fairseq_headprune.engines.engine_model import EngineModel

    start = time.perf_counter()
    loaded = random_loaded(name, beam=5)
    dictionary = loaded.task.target_dictionary
    samples = {"batch 64": random_batches(dictionary, 64, 64), "batch 1": random_batches(dictionary,
                                                                                         batch1_sentences, 1)}
    rows = levers.lever_rows(loaded.model, levers_for_benchmark(name))
    out_rows = []
    with tempfile.TemporaryDirectory(prefix="shape-cost-") as tmp:
        base = EngineModel(loaded, "ct2-int8", folder=os.path.join(tmp, "unpruned"))
        base_shape = ct2_shape(loaded.model)
        for i, (lever, value) in enumerate(rows):
            shape = Shape.of_point({lever.field: value}, levers.stack_sizes(loaded.model))
            model, target_dictionary = crude_model(loaded.model, dictionary, shape)
            cost_shape = ct2_shape(model)
            row_model = EngineModel(loaded, "ct2-int8", model, target_dictionary, os.path.join(tmp, f"r{i}"))
            del model
            row = {"lever": lever.name, "field": lever.field, "value": value, "unit": lever.unit,
                   "removable": lever.removable}
            for key, batches in samples.items():
                seconds = timing.timed_rounds({"unpruned": base.run, "row": row_model.run}, batches, runs, length)
                row[f"speedup {key}"] = round(timing.paired_speedup(seconds["unpruned"], seconds["row"]), 3)
                src = [int(n) for s in batches for n in s["net_input"]["src_lengths"].tolist()]
                row[f"flop_ratio {key}"] = round(flops.flop_ratio(base_shape, cost_shape, src, [length + 1] * len(src),
                                                                  5, max(s["id"].numel() for s in batches)), 3)
                row[f"unpruned_seconds {key}"] = round(sum(seconds["unpruned"]) / runs, 3)
            log(f"{name}: {lever.name} {value:g}: {row['speedup batch 64']:.2f}x batch 64, "
                f"{row['speedup batch 1']:.2f}x batch 1")
            out_rows.append(row)
            del row_model
    params = sum(p.numel() for p in loaded.model.parameters())
    return {"shape": name, "description": SHAPES[name][-1], "parameters": params, "rows": out_rows,
            "seconds": round(time.perf_counter() - start, 1)}


def markdown(results: List[Dict], meta: Dict) -> str:
    lines = ["# The cost table on the shapes of released models (CTranslate2 int8, one thread)", "",
             f"Measured {meta['date']} on {meta['cpu']} (CTranslate2 {meta['ctranslate2']}), by "
             "`python benchmarks/shape_cost_table.py` (the command line is in shape-cost-table.json). Randomly "
             "initialised models: speed at equal work depends on the shape, not on trained weights. Each row is one "
             "lever alone, timed against the unpruned model of the same shape, interleaved batch by batch; beam "
             f"{meta['beam']}, every hypothesis forced to {meta['length']} tokens + 1 step, random sources of 15-25 "
             f"tokens; batch 64 (one batch of 64 sentences) and batch 1 ({meta['batch1_sentences']} sentences), "
             f"{meta['runs']} rounds; speed-up = median of the paired per-batch ratios. FLOP ratio: unpruned over "
             "the row, core.flops, same work. Heads: kept in every layer of that stack (decoder: self- and "
             "cross-attention); decoder layers: how many kept (a shape measured before that lever was has no such "
             "row); FFN and output layer: share kept (`shrink --ffn-keep`, `shrink --keep-vocab`; a multilingual "
             f"shape's output layer also at one pair's share: {PAIR_WORDS:,} target words, an assumption stated "
             "below its table). The machine was shared with other jobs: ratios of a few percent are within noise.",
             ""]
    for r in results:
        own = r.get("meta", meta)
        lines += [f"## {r['shape']}: {r['description']} ({r['parameters'] / 1e6:.0f}M parameters)", "",
                  f"Measured {own['date']}: {own['runs']} rounds, forced to {own['length']} tokens + 1 step, batch 1 "
                  f"on {own['batch1_sentences']} sentences.", "",
                  "| lever | kept | x unpruned, batch 64 | FLOP ratio, batch 64 | x unpruned, batch 1 |",
                  "|---|---|---|---|---|"]
        for row in r["rows"]:
            unit = {"dec_layers": " layers"}.get(row["field"], "%" if row["field"].endswith("_percent") else " heads")
            lines.append(f"| {row['lever']} | {row['value']:g}{unit} | {row['speedup batch 64']:.2f} | "
                         f"{row['flop_ratio batch 64']:.2f} | {row['speedup batch 1']:.2f} |")
        _, _, heads, _, dec_layers, _, _ = SHAPES[r["shape"]]
        half = {"enc_heads": heads / 2, "dec_heads": heads / 2, "dec_layers": dec_layers / 2}
        order = sorted(((row["speedup batch 64"], f"{row['lever']} {row['value']:g}") for row in r["rows"]
                        if row["value"] == (50.0 if row["field"].endswith("_percent") else half.get(row["field"]))),
                       reverse=True)
        lines += ["", "At half of each lever, batch 64, fastest first: "
                  + ", ".join(f"{what} ({speed:.2f}x)" for speed, what in order) + ".", ""]
        pair = [row for row in r["rows"] if row["field"] == "vocab_percent" and row["value"] < 50]
        if pair:
            lines += [f"One pair's vocabulary: the output layer at {pair[0]['value']:g}% ({PAIR_WORDS:,} of "
                      f"{SHAPES[r['shape']][5]:,} target words, what `shrink --keep-vocab` would keep for one pair "
                      f"if its text uses about {PAIR_WORDS:,} of them: an assumption, not measured here) buys "
                      f"{pair[0]['speedup batch 64']:.2f}x at batch 64 and {pair[0]['speedup batch 1']:.2f}x at "
                      f"batch 1 alone (FLOP ratio {pair[0]['flop_ratio batch 64']:.2f}).", ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--shapes", default="opus-mt-base,wmt14-en-fr-big,wmt19-en-de-big")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--length", type=int, default=15)
    parser.add_argument("--batch1-sentences", type=int, default=8)
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    bad = [n for n in names if n not in SHAPES]
    if bad:
        parser.error(f"unknown shape {bad[0]} (known: {', '.join(SHAPES)})")
    import ctranslate2

    from fairseq_headprune.prune.levers import cpu_model
    from fairseq_headprune.records.log import atomic_output, write_json_atomic

    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "cpu": cpu_model(),
            "ctranslate2": ctranslate2.__version__, "threads": 1, "beam": 5, "length": args.length,
            "runs": args.runs, "batch1_sentences": args.batch1_sentences,
            "command": "python benchmarks/shape_cost_table.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    table, readme = os.path.join(args.out, "shape-cost-table.json"), os.path.join(args.out, "README.md")
    results = kept_shapes(table, names)
    notes = ""
    if os.path.isfile(readme):
        text = open(readme).read()
        notes = text[text.index("## Reading it"):] if "## Reading it" in text else ""
    for name in names:  # the files are rewritten whole after every shape: a run stopped early keeps the shapes done
        results = [r for r in results if r["shape"] != name]
        results.append({**measure_shape(name, args.runs, args.length, args.batch1_sentences), "meta": meta})
        results.sort(key=lambda r: list(SHAPES).index(r["shape"]))
        write_json_atomic(table, {"meta": meta, "shapes": results})
        with atomic_output(readme) as f:
            f.write(markdown(results, meta) + ("\n" + notes if notes else ""))
    print(markdown(results, meta))
    return 0


def kept_shapes(table: str, measuring: List[str]) -> List[Dict]:
    """The shapes of an earlier table that this run does not measure again, each with the settings it was measured
    with (a table from before per-shape settings: the file's)."""
    if not os.path.isfile(table):
        return []
    with open(table) as f:
        old = json.load(f)
    return [{**r, "meta": r.get("meta", old["meta"])} for r in old["shapes"] if r["shape"] not in measuring]


if __name__ == "__main__":
    sys.exit(main())
