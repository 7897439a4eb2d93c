"""Issue 29's deployment table, measured in one run (never in CI): BLEU on the test set and decoding speed of the
unpruned model and each pruned/recovered checkpoint in fairseq, CTranslate2 float32 and CTranslate2 int8, beam 5,
one thread. Writes OUT/deploy.json, OUT/deploy.md and OUT/deploy.png (BLEU against speed, the frontier drawn) and
prints the issue's targets as met or missed.

Every cell is measured in the same rounds: each round times every model in every engine in turn (interleaved, so
drift in machine load hits all alike), and speed is given as a ratio of seconds within a round, averaged over
rounds. Two kinds of speed:
- as decoded (`natural`): the test set in fairseq-generate's batches (batch 64, sorted by length), the same batches
  for CTranslate2, each model writing its own translations (the ones BLEU scores);
- equal work (`forced`): every hypothesis forced to L tokens + 1 step (L: the unpruned fairseq model's mean
  hypothesis length; fairseq --min-len L --max-len-a 0 --max-len-b L, CTranslate2 min = max decoding length L+1),
  so every model of an engine runs the same decoder steps on the same sources. The targets use this one.
Batch 1 (latency) on the first --batch1-sentences sentences, both kinds.

usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/deploy_table.py --unpruned checkpoints/de-en/model.pt \\
         --data work/recover/data-bin --references work/recover/data-bin/test.raw.en \\
         shrink-50=work/recover/shrink-50.pt shrink-ps50=work/recover/shrink-ps50.pt [--runs 3] [--out DIR]
"""
from __future__ import annotations

import argparse
import copy
import datetime
import os
import statistics
import sys
import tempfile
import time
import types
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DECODING = ["--beam", "5", "--batch-size", "64", "--max-tokens", "100000", "--bpe", "subword_nmt", "--bpe-codes",
            os.path.join(ROOT, "checkpoints/de-en/code"), "--tokenizer", "moses", "-s", "de", "-t", "en"]
ENGINES = ("fairseq", "ct2-float32", "ct2-int8")
MODES = (("natural", 64), ("forced", 64), ("natural", 1), ("forced", 1))
SPEEDUP_TARGET, BLEU_TARGET = 1.5, 0.5  # per-stack int8 over unpruned int8 (equal work, batch 64); BLEU loss


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="*", metavar="NAME=PATH", help="pruned or recovered checkpoints")
    p.add_argument("--unpruned", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--references", required=True, help="raw references of --subset")
    p.add_argument("--subset", default="test")
    p.add_argument("--decoding", nargs=argparse.REMAINDER, default=None,
                   help="fairseq options replacing the De-En defaults (last on the line)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batch1-sentences", type=int, default=100)
    p.add_argument("--out", default="results/deploy-de-en")
    args = p.parse_args(argv)
    named = [("unpruned", os.path.abspath(args.unpruned))]
    args.data, args.references = os.path.abspath(args.data), os.path.abspath(args.references)
    for item in args.models:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            p.error(f"models are NAME=PATH, not {item!r}")
        if name in dict(named):
            p.error(f"model name {name} given twice")
        named.append((name, os.path.abspath(path)))
    for name, path in named:
        if not os.path.isfile(path):
            p.error(f"{name}: no such checkpoint: {path}")
    if not os.path.isfile(args.references):
        p.error(f"no such references file: {args.references}")
    if args.runs < 1 or args.batch1_sentences < 1:
        p.error("--runs and --batch1-sentences must be at least 1")
    args.named = named
    return args


# --------------------------------------------------------------------------------------------- one model, three engines


class Contender:
    """One checkpoint loaded as fairseq-generate loads it, its evaluator (references, detokenisation) and its
    CTranslate2 exports (float32 and int8, written by export_ct2's functions into a temporary folder)."""

    def __init__(self, name: str, path: str, args, tmp: str):
        from fairseq_headprune.cli import parse
        from fairseq_headprune.evaluate import SubsetEvaluator
        from fairseq_headprune.export_ct2 import build_spec, ct2_decoding, stack_heads, write_model
        from fairseq_headprune.loading import load
        from fairseq_headprune.studies.speed_ct2 import translator

        decoding = args.decoding if args.decoding is not None else DECODING
        cfg, _ = parse("deploy-table", types.SimpleNamespace(add_args=lambda parser: None),
                       [args.data, "--path", path, "--gen-subset", args.subset, *decoding])
        self.name, self.path = name, path
        self.loaded = load(cfg)
        self.evaluator = SubsetEvaluator(self.loaded, args.subset, args.references)
        self.decoding = ct2_decoding(cfg.generation)
        self.heads_kept = sum(int(m.num_heads) for m in _attention(self.loaded.model))
        self.ct2_heads = stack_heads(self.loaded.model)
        self.shape = _shape_kind(self.loaded.model)
        task = self.loaded.task
        activation = getattr(self.loaded.saved_cfg.model, "activation_fn", None) or "relu"
        self.translators = {}
        for engine, quantization in (("ct2-float32", None), ("ct2-int8", "int8")):
            folder = os.path.join(tmp, f"{name}-{engine}")
            spec = build_spec(self.loaded.model, task.source_dictionary, task.target_dictionary, activation)
            write_model(spec, folder, quantization)
            self.translators[engine] = translator(folder, quantization or "float32", 1)

    def run(self, engine: str, samples, forced: int = 0) -> Dict:
        """Decode the batches once; seconds and each sentence's hypothesis (fairseq token ids, no EOS)."""
        if engine == "fairseq":
            return self._fairseq(samples, forced)
        return self._ct2(self.translators[engine], samples, forced)

    def _fairseq(self, samples, forced: int) -> Dict:
        import torch

        task, model = self.loaded.task, self.loaded.model
        generation = copy.deepcopy(self.loaded.cfg.generation)
        if forced:  # L tokens, then EOS forced at step L: L + 1 decoder steps
            generation.min_len, generation.max_len_a, generation.max_len_b = forced, 0, forced
        generator = task.build_generator([model], generation)
        eos = task.target_dictionary.eos()
        out = {}
        with torch.no_grad():
            start = time.perf_counter()
            for sample in samples:
                for sid, nbest in zip(sample["id"].tolist(), task.inference_step(generator, [model], sample)):
                    out[sid] = nbest[0]["tokens"]
            seconds = time.perf_counter() - start
        hyps = {sid: [t for t in tokens.tolist()] for sid, tokens in out.items()}
        return {"seconds": seconds, "hypotheses": {sid: h[:-1] if h and h[-1] == eos else h
                                                   for sid, h in hyps.items()}}

    def _ct2(self, translator_, samples, forced: int) -> Dict:
        from fairseq_headprune.export_ct2 import max_length

        src_dict, tgt_dict = self.loaded.task.source_dictionary, self.loaded.task.target_dictionary
        decoding = dict(self.decoding)
        if forced:  # the same L + 1 steps as fairseq's L tokens and EOS
            decoding["min_decoding_length"] = forced + 1
        positions = self.loaded.model.decoder.max_positions()
        batches = []
        for sample in samples:  # prepared before the clock starts: fairseq's batches are ready-made too
            tokens = sample["net_input"]["src_tokens"]
            sources = [[src_dict[t] for t in row if t not in (src_dict.pad(), src_dict.eos())]
                       for row in tokens.tolist()]
            cap = forced + 1 if forced else max_length(self.loaded.cfg.generation, tokens.size(1), positions)
            batches.append((sample["id"].tolist(), sources, cap))
        out = {}
        start = time.perf_counter()
        for ids, sources, cap in batches:
            results = translator_.translate_batch(sources, max_decoding_length=cap, **decoding)
            for sid, result in zip(ids, results):
                out[sid] = result.hypotheses[0]
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "hypotheses": {sid: [tgt_dict.index(t) for t in h] for sid, h in out.items()}}

    def bleu(self, hypotheses: Dict[int, List[int]]) -> float:
        import torch

        texts = [self.evaluator.hypothesis_text({"tokens": torch.tensor(hypotheses[i], dtype=torch.long)})
                 for i in range(self.evaluator.size)]
        return round(float(self.evaluator.bleu(texts).score), 2)


def _attention(model):
    from fairseq_headprune.heads import attention_modules

    return list(attention_modules(model).values())


def _shape_kind(model) -> str:
    """per-stack: one head count in the encoder and one in the decoder (what CTranslate2 runs unpadded)."""
    from fairseq_headprune.heads import attention_modules

    counts = {"enc": set(), "dec": set()}
    for (attn_type, _), m in attention_modules(model).items():
        counts["enc" if attn_type == "enc-self" else "dec"].add(int(m.num_heads))
    return "per-stack" if all(len(c) == 1 for c in counts.values()) else "free"


def batch1_samples(contender: Contender, n: int):
    dataset = contender.evaluator.dataset
    return [dataset.collater([dataset[i]]) for i in range(min(n, len(dataset)))]


# --------------------------------------------------------------------------------------------- the table


def measure(contenders: List[Contender], args) -> Dict:
    """All rounds, interleaved; returns the raw seconds and the first round's hypotheses per cell."""
    base = contenders[0]
    samples = {64: base.evaluator.samples, 1: batch1_samples(base, args.batch1_sentences)}
    natural = base.run("fairseq", samples[64])
    length = round(statistics.mean(len(h) for h in natural["hypotheses"].values()))
    print(f"equal work: every hypothesis forced to {length} tokens (+1 step), the unpruned model's mean", flush=True)
    cells = {(c.name, e): {f"{m}-{b}": [] for m, b in MODES} for c in contenders for e in ENGINES}
    hypotheses = {}
    for c in contenders:  # warm-up: every engine meets its shapes once
        for e in ENGINES:
            c.run(e, samples[64][:1])
    for r in range(args.runs):
        for mode, bs in MODES:
            for c in contenders:
                for e in ENGINES:
                    got = c.run(e, samples[bs], length if mode == "forced" else 0)
                    cells[(c.name, e)][f"{mode}-{bs}"].append(got["seconds"])
                    key = (c.name, e, mode, bs)
                    if r == 0:
                        hypotheses[key] = got["hypotheses"]
                    elif got["hypotheses"] != hypotheses[key]:
                        raise SystemExit(f"{key}: round {r + 1} translated differently from round 1")
            print(f"round {r + 1}/{args.runs}: {mode} batch {bs} done", flush=True)
    return {"seconds": cells, "hypotheses": hypotheses, "length": length, "sentences": {
        64: base.evaluator.size, 1: len(samples[1])}}


def paired_ratio(base: List[float], other: List[float]) -> float:
    """How many times faster `other` is than `base`, seconds paired within each round, averaged over rounds."""
    return statistics.mean(b / o for b, o in zip(base, other))


def build_table(contenders: List[Contender], measured: Dict, args) -> Dict:
    from fairseq_headprune import flops
    from fairseq_headprune.studies.speed_ct2 import ct2_shape

    base = contenders[0]
    seconds, hyps = measured["seconds"], measured["hypotheses"]
    src_lens = [int(base.evaluator.dataset.src_sizes[i]) for i in range(base.evaluator.size)]
    forced_lens = [measured["length"] + 1] * len(src_lens)
    rows = []
    for c in contenders:
        flop = {"fairseq": flops.flop_ratio(base.loaded.model, c.loaded.model, src_lens, forced_lens, 5, 64)}
        flop["ct2"] = flops.flop_ratio(ct2_shape(base.loaded.model), ct2_shape(c.loaded.model), src_lens,
                                       forced_lens, 5, 64)
        for e in ENGINES:
            cell = seconds[(c.name, e)]
            row = {"model": c.name, "checkpoint": c.path, "shape": "unpruned" if c is base else c.shape,
                   "heads_kept": c.heads_kept, "ct2_heads_per_stack": list(c.ct2_heads), "engine": e,
                   "bleu": c.bleu(hyps[(c.name, e, "natural", 64)]),
                   "flop_ratio": flop["fairseq" if e == "fairseq" else "ct2"]}
            for mode, bs in MODES:
                key = f"{mode}-{bs}"
                n = measured["sentences"][bs]
                row[f"sentences_per_s_{key}"] = round(statistics.mean(n / s for s in cell[key]), 1)
                row[f"x_unpruned_fairseq_{key}"] = round(paired_ratio(seconds[(base.name, "fairseq")][key], cell[key]),
                                                         3)
                row[f"x_unpruned_same_engine_{key}"] = round(paired_ratio(seconds[(base.name, e)][key], cell[key]), 3)
                row[f"tokens_{key}"] = sum(len(h) for h in hyps[(c.name, e, mode, bs)].values())
            if e != "fairseq":
                ours, theirs = hyps[(c.name, e, "natural", 64)], hyps[(c.name, "fairseq", "natural", 64)]
                row["differing_from_fairseq"] = sum(ours[i] != theirs[i] for i in theirs)
            rows.append(row)
    for e in ENGINES:  # equal work: every model of an engine wrote as many tokens when forced
        for mode, bs in MODES:
            if mode == "forced" and len({r[f"tokens_forced-{bs}"] for r in rows if r["engine"] == e}) != 1:
                raise SystemExit(f"{e}, batch {bs}: forced lengths gave different token counts: not equal work")
    unpruned_bleu = rows[0]["bleu"]
    for row in rows:
        row["bleu_delta"] = round(row["bleu"] - unpruned_bleu, 2)
    return {"rows": rows, "targets": targets(rows),
            "meta": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                     "ctranslate2": __import__("ctranslate2").__version__, "threads": 1, "beam": 5,
                     "subset": args.subset, "references": args.references, "data": args.data, "runs": args.runs,
                     "forced_length": measured["length"], "sentences_batch64": measured["sentences"][64],
                     "sentences_batch1": measured["sentences"][1], "command": " ".join(sys.argv)}}


def targets(rows: List[Dict]) -> Dict:
    """The issue's targets: unpruned CT2 float32 as fairseq; the best per-stack model in CT2 int8 >= 1.5x the
    unpruned CT2 int8 (equal work, batch 64) within 0.5 BLEU of the unpruned fairseq model."""
    cell = {(r["model"], r["engine"]): r for r in rows}
    unpruned_fairseq, unpruned_f32 = cell[("unpruned", "fairseq")], cell[("unpruned", "ct2-float32")]
    out = {"float32_as_fairseq": {
        "differing": unpruned_f32["differing_from_fairseq"], "bleu_fairseq": unpruned_fairseq["bleu"],
        "bleu_ct2_float32": unpruned_f32["bleu"],
        "met": abs(unpruned_f32["bleu"] - unpruned_fairseq["bleu"]) <= 0.05}}
    candidates = [r for r in rows if r["engine"] == "ct2-int8" and r["shape"] == "per-stack"]
    per_model = []
    for r in candidates:
        speed = r["x_unpruned_same_engine_forced-64"]
        per_model.append({"model": r["model"], "x_unpruned_int8": speed, "bleu": r["bleu"],
                          "bleu_loss": round(unpruned_fairseq["bleu"] - r["bleu"], 2),
                          "x_unpruned_fairseq": r["x_unpruned_fairseq_forced-64"],
                          "x_unpruned_int8_batch1": r["x_unpruned_same_engine_forced-1"],
                          "flop_ratio": round(r["flop_ratio"], 3),
                          "met": speed >= SPEEDUP_TARGET and unpruned_fairseq["bleu"] - r["bleu"] <= BLEU_TARGET})
    best = max(per_model, key=lambda m: (m["met"], m["bleu"]), default=None)
    out["per_stack_int8"] = {"models": per_model, "best": best, "met": bool(best and best["met"])}
    return out


# --------------------------------------------------------------------------------------------- files


def markdown(table: Dict) -> str:
    meta, rows = table["meta"], table["rows"]
    lines = [f"# Deployment table ({meta['date']})", "",
             f"`{meta['command']}`", "",
             f"BLEU: sacreBLEU on detokenised output of '{meta['subset']}' ({meta['sentences_batch64']} sentences), "
             f"beam 5, batch 64 as decoded. Speed: one thread, CTranslate2 {meta['ctranslate2']}, {meta['runs']} "
             "interleaved rounds, as a ratio of seconds within each round (averaged): absolute sentences/s depend "
             "on the machine's load, the ratios much less. *as decoded*: each model's own translations; *equal "
             f"work*: every hypothesis forced to {meta['forced_length']} tokens + 1 step. Batch 1: the first "
             f"{meta['sentences_batch1']} sentences.", "",
             "| model | shape | heads | CT2 heads enc/dec | engine | BLEU | ΔBLEU | sent/s b64 | x fairseq unpruned b64 "
             "| x same engine unpruned, equal work b64 | same, b1 | FLOP ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['shape']} | {r['heads_kept']} | {r['ct2_heads_per_stack'][0]}/"
                     f"{r['ct2_heads_per_stack'][1]} | {r['engine']} | {r['bleu']:.2f} | {r['bleu_delta']:+.2f} | "
                     f"{r['sentences_per_s_natural-64']:.1f} | {r['x_unpruned_fairseq_natural-64']:.2f} | "
                     f"{r['x_unpruned_same_engine_forced-64']:.2f} | {r['x_unpruned_same_engine_forced-1']:.2f} | "
                     f"{r['flop_ratio']:.2f} |")
    lines += ["", "## Targets", ""] + target_lines(table["targets"])
    return "\n".join(lines) + "\n"


def target_lines(t: Dict) -> List[str]:
    f = t["float32_as_fairseq"]
    lines = [f"- unpruned model in CTranslate2 float32 as fairseq: {f['differing']} hypotheses differ, BLEU "
             f"{f['bleu_ct2_float32']:.2f} vs {f['bleu_fairseq']:.2f}: **{'met' if f['met'] else 'missed'}**"]
    p = t["per_stack_int8"]
    if not p["models"]:
        return lines + ["- per-stack model in CTranslate2 int8: **no per-stack model in the table**"]
    for m in p["models"]:
        lines.append(f"- {m['model']} (per-stack) in CTranslate2 int8: {m['x_unpruned_int8']:.2f}x the unpruned "
                     f"model's int8 at batch 64, equal work (target {SPEEDUP_TARGET}x; FLOP ratio {m['flop_ratio']:.2f};"
                     f" batch 1 {m['x_unpruned_int8_batch1']:.2f}x), {m['x_unpruned_fairseq']:.2f}x unpruned fairseq; "
                     f"BLEU {m['bleu']:.2f}, {m['bleu_loss']:.2f} below unpruned fairseq (target {BLEU_TARGET}): "
                     f"**{'met' if m['met'] else 'missed'}**")
    lines.append(f"- best per-stack model: {p['best']['model']}: target **{'met' if p['met'] else 'missed'}**")
    return lines


def write_all(table: Dict, out: str) -> None:
    from fairseq_headprune.plots import deploy_frontier
    from fairseq_headprune.results.log import atomic_output, write_json_atomic

    os.makedirs(out, exist_ok=True)
    write_json_atomic(os.path.join(out, "deploy.json"), table)
    with atomic_output(os.path.join(out, "deploy.md")) as f:
        f.write(markdown(table))
    deploy_frontier(table["rows"], os.path.join(out, "deploy.png"))


def main(argv=None) -> int:
    args = parse_args(argv)
    from fairseq_headprune.cli import _quiet_dependencies
    from fairseq_headprune.loading import trust_fairseq_checkpoints

    trust_fairseq_checkpoints()
    _quiet_dependencies()
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="deploy-table-") as tmp:
        contenders = [Contender(name, path, args, tmp) for name, path in args.named]
        measured = measure(contenders, args)
        table = build_table(contenders, measured, args)
    write_all(table, args.out)
    print("\n".join(target_lines(table["targets"])))
    print(f"wrote {args.out}/deploy.md, deploy.json, deploy.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
