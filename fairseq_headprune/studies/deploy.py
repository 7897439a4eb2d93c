"""The deployment table: BLEU and decoding speed of the unpruned model and its pruned (or recovered) checkpoints in
fairseq, CTranslate2 float32 and CTranslate2 int8, every cell measured in one run (`fairseq-headprune deploy`, and
the `deploy` part of `report`).

Optionally the study first shrinks the model itself (`shrink_percent`, per-stack shape by default: the shape
CTranslate2 runs without padding), so one command answers "what does pruning buy where I deploy?".

Every cell is timed in the same rounds, interleaved batch by batch (each batch decoded by every model in every
engine in turn, in a seeded random order drawn for every batch), so drift in machine load hits all alike; speed is a
ratio of seconds within a round, averaged over rounds.
Two kinds of speed:
- as decoded (`natural`): the subset in fairseq-generate's batches (--batch-size/--max-tokens, sorted by length),
  the same batches for CTranslate2, each model writing its own translations (the ones BLEU scores);
- equal work (`forced`): every hypothesis forced to L tokens + 1 step (L: the unpruned fairseq model's mean
  hypothesis length; fairseq min = max length L, CTranslate2 min = max decoding length L + 1), so every model of an
  engine runs the same decoder steps on the same sources. The targets use this one.
Batch 1 (latency) on the first `batch1_sentences` sentences, both kinds. One thread throughout.
"""
from __future__ import annotations

import datetime
import functools
import json
import os
import re
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_headprune.prune.shrink import shrink, write_checkpoint
from fairseq_headprune.prune.shrink_options import ShrinkOptions
from fairseq_headprune.core import flops
from fairseq_headprune.core.heads import attention_modules
from fairseq_headprune.core.masking import set_head_masks
from fairseq_headprune.core.shape import Shape
from fairseq_headprune.core.surgery import crude_model
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.engines import timing
from fairseq_headprune.engines.ct2 import check_task, ct2_decoding, ct2_run, ct2_shape, ct2_translator
from fairseq_headprune.engines.ct2_spec import stack_heads
from fairseq_headprune.engines.fairseq_engine import fairseq_run
from fairseq_headprune.engines.timing import paired_ratio, rounds_interval, target_verdict
from fairseq_headprune.errors import UserError
from fairseq_headprune.fairseq_io.loading import load_other
from fairseq_headprune.options import option
from fairseq_headprune.plots import deploy_frontier
from fairseq_headprune.records.identity import calibration_files_sha256, file_sha256
from fairseq_headprune.records.log import atomic_output, read_json, write_json_atomic
from fairseq_headprune.stats import BleuBootstrap, ChrfBootstrap

ENGINES = ("fairseq", "ct2-float32", "ct2-int8")
# (kind, batch): "batch" is the subset's own batches (--batch-size / --max-tokens), 1 the latency batches
MODES = (("natural", "batch"), ("forced", "batch"), ("natural", 1), ("forced", 1))
SPEEDUP_TARGET, BLEU_TARGET = 1.5, 0.5  # per-stack int8 over unpruned int8 (equal work, batched); BLEU loss
FILES = ("deploy.json", "deploy.md", "deploy.png")
BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED = 1000, 1
SIGNIFICANCE = (f"p: paired bootstrap of sacreBLEU against the unpruned model in fairseq (compare-mt's test, "
                f"{BOOTSTRAP_SAMPLES} full-size resamples, seed {BOOTSTRAP_SEED}, one-sided in the observed "
                "direction); chrF's p (sacreBLEU's chrF2) on the same resamples")
MODELS = "models"  # the study's own shrunk checkpoint and its record, in a folder of its own
INTERLEAVED = "batch by batch (every cell decodes each batch in turn, in an order drawn anew for every batch)"


@dataclass
class DeployOptions:
    """What `fairseq-headprune deploy` measures; every field has the command's default."""

    subset: str = field(default="test", metadata={"flag": "--gen-subset"})
    references: Optional[str] = option(None, flag="--references",
                                       help="raw reference file of --gen-subset for BLEU (default: the binarised "
                                            "targets)")
    compare: Tuple[str, ...] = option((), flag="--compare", nargs="+", metavar="NAME=CKPT", parse=tuple,
                                      help="pruned or recovered checkpoints to put beside the unpruned one")
    shrink_percent: float = option(50.0, flag="--shrink-percent",
                                   help="shrink the model itself, removing this share of its heads (0: no shrink of "
                                        "its own)")
    shape: str = option("per-stack", flag="--shape", choices=("free", "per-stack"),
                        help="the shrink's shape (per-stack: what CTranslate2 runs without padding)")
    calibration_subset: str = option("valid", flag="--calibration-subset", help="the shrink's calibration subset")
    calibration_sentences: int = option(1000, flag="--calibration-sentences",
                                        help="the shrink's calibration sentences")
    runs: int = option(3, flag="--runs", help="interleaved timing rounds")
    batch1_sentences: int = option(100, flag="--batch1-sentences", help="sentences timed one at a time (latency)")
    candidate: Optional[str] = option(None, flag="--candidate", metavar="NAME",
                                      help="the per-stack model the targets judge, chosen beforehand on held-out data "
                                           "(default: the best of the table on this set, which flatters it when "
                                           "several are compared)")
    ceilings: Tuple[str, ...] = option((), flag="--ceilings", nargs="+", metavar="ENC/DEC[:ffn=P%,vocab=P%]",
                                       parse=tuple,
                                       help="shapes timed in CTranslate2 int8 at equal work as crude slices of the "
                                            "unpruned model (the first heads per layer, FFN units, target words): "
                                            "what each shape would run at")

    def named_checkpoints(self) -> List[Tuple[str, str]]:
        """--compare as (name, path), refused in one line when malformed, repeated or missing."""
        named: List[Tuple[str, str]] = []
        for item in self.compare:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise UserError(f"--compare takes NAME=CHECKPOINT, not {item!r}")
            if name in ("unpruned", self.shrunk_name()) or name in dict(named):
                raise UserError(f"--compare: the name {name} is taken")
            if not os.path.isfile(path):
                raise UserError(f"--compare {name}: no such checkpoint: {path}")
            named.append((name, path))
        return named

    def shrunk_name(self) -> Optional[str]:
        if not self.shrink_percent:
            return None
        return f"shrink-{'ps' if self.shape == 'per-stack' else ''}{self.shrink_percent:g}"

    def check(self) -> None:
        if not 0 <= self.shrink_percent < 100:
            raise UserError(f"--shrink-percent must be in [0, 100), not {self.shrink_percent:g}")
        if self.runs < 1 or self.batch1_sentences < 1:
            raise UserError("--runs and --batch1-sentences must be at least 1")
        if self.references and not os.path.isfile(self.references):
            raise UserError(f"--references: no such file: {self.references}")
        if not self.shrink_percent and not self.compare:
            raise UserError("nothing to compare: give --compare NAME=CKPT or --shrink-percent")
        names = [name for name, _ in self.named_checkpoints()] + ([self.shrunk_name()] if self.shrink_percent else [])
        if self.candidate is not None and self.candidate not in names:
            raise UserError(f"--candidate {self.candidate}: not a model of this table ({', '.join(names)})")
        self.ceiling_shapes()

    def ceiling_shapes(self):
        shapes = [Shape.parse(text) for text in self.ceilings]
        if len(set(shapes)) != len(shapes):
            raise UserError("--ceilings: a shape is given twice")
        return shapes


# --------------------------------------------------------------------------------------------- one model, three engines


def heads_per_layer(model_cfg) -> dict:
    """{stack: {heads per attention sublayer}} of a checkpoint's model config (its kept_heads over the
    architecture's counts), read without building the model."""
    import json

    get = (lambda k: model_cfg.get(k)) if hasattr(model_cfg, "get") else (lambda k: getattr(model_cfg, k, None))
    kept = json.loads(get("kept_heads") or "{}")
    counts = {"encoder": set(), "decoder": set()}
    for attn_type, stack, layers, heads in (
            ("enc-self", "encoder", get("encoder_layers"), get("encoder_attention_heads")),
            ("dec-self", "decoder", get("decoder_layers"), get("decoder_attention_heads")),
            ("enc-dec", "decoder", get("decoder_layers"), get("decoder_attention_heads"))):
        for layer in range(1, int(layers or 0) + 1):
            ids = kept.get(attn_type, {}).get(str(layer))
            counts[stack].add(len(ids) if ids is not None else int(heads or 0))
    return counts


def check_candidate(options) -> None:
    """--candidate names the per-stack model the targets judge: a free-shape one is refused before any timing
    (the table would time every model, then give it no verdict)."""
    import torch

    if options.candidate is None:
        return
    if options.candidate == options.shrunk_name():
        if options.shape != "per-stack":
            raise UserError(f"--candidate {options.candidate} is deploy's own --shape {options.shape} shrink: the "
                            "targets judge a per-stack model")
        return
    path = dict(options.named_checkpoints())[options.candidate]
    state = torch.load(path, map_location="cpu", weights_only=False)
    model_cfg = (state.get("cfg") or {}).get("model") or state.get("args")
    counts = heads_per_layer(model_cfg) if model_cfg is not None else {}
    if any(len(c) > 1 for c in counts.values()):
        shown = ", ".join(f"{stack} {sorted(c)}" for stack, c in counts.items())
        raise UserError(f"--candidate {options.candidate} has a free shape (heads per layer: {shown}): the targets "
                        "judge a per-stack model (shrink --shape per-stack)")


class Contender:
    """One checkpoint loaded as fairseq-generate loads it, its evaluator (references, detokenisation) and its
    CTranslate2 exports (float32 and int8, written by engines.ct2 into a temporary folder)."""

    def __init__(self, name: str, loaded, options: DeployOptions, tmp: str):
        self.name, self.path, self.loaded = name, loaded.checkpoint, loaded
        self.evaluator = SubsetEvaluator(loaded, options.subset, options.references)
        self.decoding = ct2_decoding(loaded.cfg.generation)
        self.heads_kept = sum(int(m.num_heads) for m in _attention(loaded.model))
        self.ct2_heads = stack_heads(loaded.model)
        self.shape = shape_kind(loaded.model)
        self.translators = {engine: ct2_translator(loaded, loaded.model, os.path.join(tmp, f"{name}-{engine}"),
                                                   quantization)
                            for engine, quantization in (("ct2-float32", None), ("ct2-int8", "int8"))}

    def run(self, engine: str, samples, forced: int = 0) -> Dict:
        """Decode the batches once; seconds and each sentence's hypothesis (fairseq token ids, no EOS)."""
        if engine == "fairseq":
            return self._fairseq(samples, forced)
        return self._ct2(self.translators[engine], samples, forced)

    def _fairseq(self, samples, forced: int) -> Dict:
        return fairseq_run(self.loaded, self.loaded.model, samples, forced)

    def _ct2(self, translator_, samples, forced: int) -> Dict:
        return ct2_run(translator_, self.loaded, self.decoding, samples, forced)

    def texts(self, hypotheses: Dict[int, List[int]]) -> List[str]:
        """The hypotheses as fairseq-generate's D- lines, in sentence order (what sacreBLEU scores)."""
        import torch

        return [self.evaluator.hypothesis_text({"tokens": torch.tensor(hypotheses[i], dtype=torch.long)})
                for i in range(self.evaluator.size)]

    def bleu(self, texts: List[str]) -> float:
        return round(float(self.evaluator.bleu(texts).score), 2)


class Ceiling:
    """A crude slice of the unpruned model to a shape (core.surgery.crude_model), exported to CTranslate2 int8 and
    timed at equal work only: the speed any model of that shape runs at."""

    engine = "ct2-int8"

    def __init__(self, shape, base: Contender, tmp: str):
        loaded = base.loaded
        self.shape, self.name, self.base = shape, f"ceiling {shape.label}", base
        model, target_dictionary = crude_model(loaded.model, loaded.task.target_dictionary, shape)
        self.ct2_heads, self.cost_shape = stack_heads(model), ct2_shape(model)  # the model itself is not kept
        folder = os.path.join(tmp, "ceiling-" + re.sub(r"[^0-9a-z]+", "-", shape.label))
        self.translator = ct2_translator(loaded, model, folder, "int8", target_dictionary)

    def run(self, samples, forced: int) -> Dict:
        return ct2_run(self.translator, self.base.loaded, self.base.decoding, samples, forced)


def _attention(model):
    return list(attention_modules(model).values())


def shape_kind(model) -> str:
    """per-stack: one head count in the encoder and one in the decoder (what CTranslate2 runs unpadded)."""
    counts = {"enc": set(), "dec": set()}
    for (attn_type, _), m in attention_modules(model).items():
        counts["enc" if attn_type == "enc-self" else "dec"].add(int(m.num_heads))
    return "per-stack" if all(len(c) == 1 for c in counts.values()) else "free"


def batch1_samples(contender: Contender, n: int):
    dataset = contender.evaluator.dataset
    return [dataset.collater([dataset[i]]) for i in range(min(n, len(dataset)))]


# --------------------------------------------------------------------------------------------- the table


def time_cells(contenders: Sequence[Contender], runs: int, batch1_sentences: int, log=print,
               ceilings: Sequence[Ceiling] = ()) -> Dict:
    """All rounds; the seconds of every cell per round and the first round's hypotheses. Interleaved batch by batch
    (engines.timing.interleaved): each batch is decoded by every cell in turn, in an order drawn anew for every
    batch, so a drift in the machine's speed (another tenant, the clock) hits every cell alike, and no cell owes its
    time to its place in the order or to the cell before it (a fixed rotation left one model 3.5% ahead of its
    identical twin here). A cell that translates differently in a later round is an error (the timing would not be
    of the same work). Ceilings are timed in the same rounds, at equal work only, in their one engine."""
    base = contenders[0]
    samples = {"batch": base.evaluator.samples, 1: batch1_samples(base, batch1_sentences)}
    natural = base.run("fairseq", samples["batch"])
    length = round(statistics.mean(len(h) for h in natural["hypotheses"].values()))
    log(f"equal work: every hypothesis forced to {length} tokens (+1 step), the unpruned model's mean")
    decoders = {(c.name, e): functools.partial(c.run, e) for c in contenders for e in ENGINES}
    ceiling_decoders = {(c.name, c.engine): c.run for c in ceilings}
    cells = {key: {f"{m}-{b}": [] for m, b in MODES} for key in decoders}
    cells.update({key: {f"forced-{b}": [] for m, b in MODES if m == "forced"} for key in ceiling_decoders})
    timing.warm_up(decoders, samples["batch"])  # every engine meets its shapes once
    timing.warm_up({key: functools.partial(decode, forced=length) for key, decode in ceiling_decoders.items()},
                   samples["batch"])
    hypotheses = {}
    for r in range(runs):
        for mode, bs in MODES:
            forced = length if mode == "forced" else 0
            timed = {**decoders, **(ceiling_decoders if forced else {})}
            results = timing.interleaved({key: functools.partial(decode, forced=forced)
                                          for key, decode in timed.items()}, samples[bs], f"{r}-{mode}-{bs}")
            for key in timed:
                cells[key][f"{mode}-{bs}"].append(timing.seconds(results[key]))
                written = timing.hypotheses(results[key])
                if r == 0:
                    hypotheses[(*key, mode, bs)] = written
                elif written != hypotheses[(*key, mode, bs)]:
                    raise RuntimeError(f"{(*key, mode, bs)}: round {r + 1} translated differently from round 1")
            log(f"round {r + 1}/{runs}: {mode}, {'batched' if bs == 'batch' else 'batch 1'}, done")
    return {"seconds": cells, "hypotheses": hypotheses, "length": length,
            "sentences": {"batch": base.evaluator.size, 1: len(samples[1])}}


def cost_lengths(base: Contender, measured: Dict) -> Dict:
    """What the FLOP ratios are computed on: the source lengths, every hypothesis at the forced length + 1 step, the
    beam and the largest batch."""
    src_lens = [int(n) for s in base.evaluator.samples for n in s["net_input"]["src_lengths"].tolist()]
    return {"src": src_lens, "forced": [measured["length"] + 1] * len(src_lens),
            "beam": int(base.loaded.cfg.generation.beam),
            "batch": max(s["id"].numel() for s in base.evaluator.samples)}


def flop_ratio(base_shape, shape, lengths: Dict) -> float:
    return flops.flop_ratio(base_shape, shape, lengths["src"], lengths["forced"], lengths["beam"], lengths["batch"])


def speed_columns(measured: Dict, base: Contender, c: Contender, e: str) -> Dict:
    """A cell's speed in every mode: sentences/s, times the unpruned model in fairseq and in the same engine, tokens."""
    seconds, hyps = measured["seconds"], measured["hypotheses"]
    cell = seconds[(c.name, e)]
    row = {}
    for mode, bs in MODES:
        key = f"{mode}-{bs}"
        n = measured["sentences"][bs]
        row[f"sentences_per_s_{key}"] = round(statistics.mean(n / s for s in cell[key]), 1)
        row[f"x_unpruned_fairseq_{key}"] = round(paired_ratio(seconds[(base.name, "fairseq")][key], cell[key]), 3)
        row[f"x_unpruned_same_engine_{key}"] = round(paired_ratio(seconds[(base.name, e)][key], cell[key]), 3)
        row[f"x_unpruned_same_engine_{key}_interval"] = rounds_interval(seconds[(base.name, e)][key], cell[key])
        row[f"tokens_{key}"] = sum(len(h) for h in hyps[(c.name, e, mode, bs)].values())
    return row


def model_rows(contenders: Sequence[Contender], measured: Dict, lengths: Dict) -> List[Dict]:
    """A row per model and engine: BLEU as decoded and its p against the unpruned model in fairseq, the speed
    columns, the FLOP ratio, and in CTranslate2 how many hypotheses differ from the model's own in fairseq."""
    base = contenders[0]
    hyps = measured["hypotheses"]
    texts = {(c.name, e): c.texts(hyps[(c.name, e, "natural", "batch")]) for c in contenders for e in ENGINES}
    bootstrap = BleuBootstrap(base.evaluator.references, texts[(base.name, "fairseq")], BOOTSTRAP_SAMPLES,
                              BOOTSTRAP_SEED)
    chrf = ChrfBootstrap(bootstrap, base.evaluator.references)  # on the same resamples
    rows = []
    for c in contenders:
        flop = {"fairseq": flop_ratio(base.loaded.model, c.loaded.model, lengths),
                "ct2": flop_ratio(ct2_shape(base.loaded.model), ct2_shape(c.loaded.model), lengths)}
        for e in ENGINES:
            row = {"model": c.name, "checkpoint": c.path, "shape": "unpruned" if c is base else c.shape,
                   "heads_kept": c.heads_kept, "ct2_heads_per_stack": list(c.ct2_heads), "engine": e,
                   "bleu": c.bleu(texts[(c.name, e)]),
                   "p_vs_unpruned_fairseq": None if (c is base and e == "fairseq")
                   else round(bootstrap.test(texts[(c.name, e)]).p_value, 4),
                   "chrf": round(chrf.score(texts[(c.name, e)]), 2),
                   "chrf_p_vs_unpruned_fairseq": None if (c is base and e == "fairseq")
                   else round(chrf.test(texts[(c.name, e)]).p_value, 4),
                   "flop_ratio": flop["fairseq" if e == "fairseq" else "ct2"]}
            row.update(speed_columns(measured, base, c, e))
            if e != "fairseq":
                ours, theirs = hyps[(c.name, e, "natural", "batch")], hyps[(c.name, "fairseq", "natural", "batch")]
                row["differing_from_fairseq"] = sum(ours[i] != theirs[i] for i in theirs)
            rows.append(row)
    return rows


def ceiling_row(c: Ceiling, base: Contender, measured: Dict, lengths: Dict) -> Dict:
    """A ceiling's speed at equal work over the unpruned model in the same engine, and its FLOP ratio."""
    seconds, hyps = measured["seconds"], measured["hypotheses"]
    row = {"shape": c.shape.label, "ct2_heads_per_stack": list(c.ct2_heads), "engine": c.engine,
           "ffn_percent": c.shape.ffn_percent, "vocab_percent": c.shape.vocab_percent,
           "flop_ratio": flop_ratio(ct2_shape(base.loaded.model), c.cost_shape, lengths)}
    for bs in ("batch", 1):
        key = f"forced-{bs}"
        row[f"x_unpruned_same_engine_{key}"] = round(
            paired_ratio(seconds[(base.name, c.engine)][key], seconds[(c.name, c.engine)][key]), 3)
        row[f"x_unpruned_same_engine_{key}_interval"] = rounds_interval(seconds[(base.name, c.engine)][key],
                                                                        seconds[(c.name, c.engine)][key])
        row[f"tokens_{key}"] = sum(len(h) for h in hyps[(c.name, c.engine, "forced", bs)].values())
    return row


def check_equal_work(rows: Sequence[Dict]) -> None:
    """Every model of an engine (and every ceiling) wrote as many tokens when forced, or the timing is not of equal
    work."""
    for e in ENGINES:
        for mode, bs in MODES:
            counts = {r[f"tokens_forced-{bs}"] for r in rows if r["engine"] == e}
            if mode == "forced" and len(counts) != 1:
                raise RuntimeError(f"{e}, batch {bs}: forced lengths gave different token counts: not equal work")


def table_meta(base: Contender, measured: Dict, options: DeployOptions, lengths: Dict) -> Dict:
    """How the table was measured: when, on what, with which versions, options and batches."""
    import ctranslate2  # optional heavy dependency: CTranslate2 (its version)

    dataset = base.loaded.cfg.dataset
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "checkpoint_sha256": file_sha256(base.path),
            "ctranslate2": ctranslate2.__version__, "threads": 1, "beam": lengths["beam"],
            "batch_size": dataset.batch_size, "max_tokens": dataset.max_tokens, "largest_batch": lengths["batch"],
            "subset": options.subset, "references": options.references or "binarised targets, decoded",
            "runs": options.runs, "forced_length": measured["length"], "significance": SIGNIFICANCE,
            "interleaved": INTERLEAVED,
            "sentences_batched": measured["sentences"]["batch"], "sentences_batch1": measured["sentences"][1],
            "options": asdict(options)}


def build_table(contenders: Sequence[Contender], measured: Dict, options: DeployOptions,
                ceilings: Sequence[Ceiling] = ()) -> Dict:
    """The table: a row per model and engine, a row per ceiling, the targets, and how it was measured."""
    base = contenders[0]
    lengths = cost_lengths(base, measured)
    rows = model_rows(contenders, measured, lengths)
    ceiling_rows = [ceiling_row(c, base, measured, lengths) for c in ceilings]
    check_equal_work(rows + ceiling_rows)
    for row in rows:
        row["bleu_delta"] = round(row["bleu"] - rows[0]["bleu"], 2)
        row["chrf_delta"] = round(row["chrf"] - rows[0]["chrf"], 2)
    return {"rows": rows, "targets": targets(rows, options.candidate), "ceilings": ceiling_rows,
            "meta": table_meta(base, measured, options, lengths)}


def targets(rows: List[Dict], candidate: Optional[str] = None) -> Dict:
    """The deployment targets: unpruned CT2 float32 as fairseq; a per-stack model in CT2 int8 >= 1.5x the unpruned
    CT2 int8 (equal work, batched) within 0.5 BLEU of the unpruned fairseq model. The model judged is `candidate`
    when given (chosen beforehand on held-out data); else the best of this table, a choice made on the scored set
    itself, which flatters it when there are several."""
    cell = {(r["model"], r["engine"]): r for r in rows}
    unpruned_fairseq, unpruned_f32 = cell[("unpruned", "fairseq")], cell[("unpruned", "ct2-float32")]
    out = {"float32_as_fairseq": {
        "differing": unpruned_f32["differing_from_fairseq"], "bleu_fairseq": unpruned_fairseq["bleu"],
        "bleu_ct2_float32": unpruned_f32["bleu"],
        "met": abs(unpruned_f32["bleu"] - unpruned_fairseq["bleu"]) <= 0.05}}
    per_model = []
    for r in (r for r in rows if r["engine"] == "ct2-int8" and r["shape"] == "per-stack"):
        speed = r["x_unpruned_same_engine_forced-batch"]
        interval = r.get("x_unpruned_same_engine_forced-batch_interval")
        per_model.append({"model": r["model"], "x_unpruned_int8": speed, "x_unpruned_int8_interval": interval,
                          "speed_verdict": target_verdict(interval, SPEEDUP_TARGET) if interval else None,
                          "bleu": r["bleu"],
                          "bleu_loss": round(unpruned_fairseq["bleu"] - r["bleu"], 2),
                          "p": r.get("p_vs_unpruned_fairseq"),
                          "x_unpruned_fairseq": r["x_unpruned_fairseq_forced-batch"],
                          "x_unpruned_int8_batch1": r["x_unpruned_same_engine_forced-1"],
                          "flop_ratio": round(r["flop_ratio"], 3),
                          "met": speed >= SPEEDUP_TARGET and unpruned_fairseq["bleu"] - r["bleu"] <= BLEU_TARGET})
    if candidate is not None:
        best = next((m for m in per_model if m["model"] == candidate), None)
        chosen_by = "named before this table (--candidate)"
    else:
        best = max(per_model, key=lambda m: (m["met"], m["bleu"]), default=None)
        chosen_by = ("the only per-stack model" if len(per_model) == 1 else
                     f"the best of {len(per_model)} on this set (chosen on the scored set: optimistic)")
    out["per_stack_int8"] = {"models": per_model, "best": best, "met": bool(best and best["met"]),
                             "candidate": candidate, "chosen_by": chosen_by}
    return out


# --------------------------------------------------------------------------------------------- files


HEADERS = ("model", "shape", "heads", "CT2 heads enc/dec", "engine", "BLEU", "ΔBLEU", "p", "chrF", "ΔchrF (p)",
           "sent/s batched",
           "x fairseq unpruned", "x same engine unpruned, equal work", "same, batch 1", "FLOP ratio")


def description(meta: Dict) -> str:
    """How the table was measured, in a paragraph."""
    batching = " and ".join(([f"--batch-size {meta['batch_size']}"] if meta["batch_size"] else [])
                            + ([f"--max-tokens {meta['max_tokens']}"] if meta["max_tokens"] else []))
    return (f"BLEU: sacreBLEU on detokenised output of '{meta['subset']}' ({meta['sentences_batched']} sentences), "
            f"beam {meta['beam']}, as decoded. Speed: one thread, CTranslate2 {meta['ctranslate2']}, {meta['runs']} "
            f"rounds interleaved {meta.get('interleaved', 'model by model')}, as a ratio of seconds within each round "
            "(averaged; in brackets its 95% Student-t interval over the rounds): absolute sentences/s depend on "
            f"the machine's load, the ratios much less. Batched: fairseq's batches ({batching}; the largest holds "
            f"{meta['largest_batch']} sentences), the same for every engine. *as decoded*: each model's own "
            f"translations; *equal work*: every hypothesis forced to {meta['forced_length']} tokens + 1 step. "
            f"Batch 1: the first {meta['sentences_batch1']} sentences. "
            + meta.get("significance", "p: not computed by the version of deploy that wrote this table") + ".")


def cells(table: Dict) -> List[List[str]]:
    return [[r["model"], r["shape"], str(r["heads_kept"]), "/".join(map(str, r["ct2_heads_per_stack"])), r["engine"],
             f"{r['bleu']:.2f}", f"{r['bleu_delta']:+.2f}", _p(r.get("p_vs_unpruned_fairseq")), *chrf_cells(r),
             f"{r['sentences_per_s_natural-batch']:.1f}",
             f"{r['x_unpruned_fairseq_natural-batch']:.2f}", with_interval(r, "x_unpruned_same_engine_forced-batch"),
             with_interval(r, "x_unpruned_same_engine_forced-1"), f"{r['flop_ratio']:.2f}"] for r in table["rows"]]


def chrf_cells(row: Dict) -> List[str]:
    """chrF and its difference with p (a table written before chrF: not measured)."""
    if "chrf" not in row:
        return ["not measured", ""]
    p = row.get("chrf_p_vs_unpruned_fairseq")
    return [f"{row['chrf']:.2f}", f"{row['chrf_delta']:+.2f}" + (f" ({_p(p)})" if p is not None else "")]


def with_interval(row: Dict, key: str) -> str:
    """A ratio with its 95% interval over the rounds, "1.55 (1.44-1.66)" (a table written before intervals: alone)."""
    interval = row.get(f"{key}_interval")
    return f"{row[key]:.2f}" + (f" ({interval['low']:.2f}-{interval['high']:.2f})" if interval else "")


def _p(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.3f}"


def markdown(table: Dict) -> str:
    lines = [f"# Deployment table ({table['meta']['date']})", "", description(table["meta"]), "",
             "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in cells(table)]
    lines += ["", "Targets:", ""] + [f"- {line}" for line in target_lines(table["targets"])]
    if table.get("ceilings"):
        lines += ["", "## Ceilings", "", CEILINGS_TEXT, "", "| " + " | ".join(CEILING_HEADERS) + " |",
                  "|" + "---|" * len(CEILING_HEADERS)]
        lines += ["| " + " | ".join(row) + " |" for row in ceiling_cells(table["ceilings"])]
        lines += ["", ceiling_verdict(table["ceilings"])]
    return "\n".join(lines) + "\n"


CEILINGS_TEXT = ("Speed only: the unpruned model cut to a shape (the first heads of every layer, FFN hidden units and "
                 "target words), exported to CTranslate2 int8 and timed in the same rounds at equal work: the speed "
                 "any model of that shape runs at. Its BLEU means nothing and is not measured.")
CEILING_HEADERS = ("shape (heads enc/dec)", "FFN kept", "vocabulary kept", "x unpruned int8, equal work",
                   "same, batch 1", "FLOP ratio")


def ceiling_cells(ceilings: List[Dict]) -> List[List[str]]:
    return [[c["shape"], f"{c['ffn_percent']:g}%", f"{c['vocab_percent']:g}%",
             f"{c['x_unpruned_same_engine_forced-batch']:.2f}", f"{c['x_unpruned_same_engine_forced-1']:.2f}",
             f"{c['flop_ratio']:.2f}"] for c in ceilings]


def ceiling_verdict(ceilings: List[Dict]) -> str:
    reach = [c["shape"] for c in ceilings if c["x_unpruned_same_engine_forced-batch"] >= SPEEDUP_TARGET]
    return (f"Ceilings at or above the {SPEEDUP_TARGET}x target (batched): "
            + (", ".join(reach) if reach else "none") + ".")


def _p_clause(value: Optional[float]) -> str:
    return "" if value is None else f" (p {value:.3f})"


def target_lines(t: Dict) -> List[str]:
    """The targets as met or missed, one line each (no list markers)."""
    f = t["float32_as_fairseq"]
    lines = [f"unpruned model in CTranslate2 float32 as fairseq: {f['differing']} hypotheses differ, BLEU "
             f"{f['bleu_ct2_float32']:.2f} vs {f['bleu_fairseq']:.2f}: **{'met' if f['met'] else 'missed'}**"]
    p = t["per_stack_int8"]
    if not p["models"]:
        return lines + ["per-stack model in CTranslate2 int8: **no per-stack model in the table**"]
    for m in p["models"]:
        lines.append(f"{m['model']} (per-stack) in CTranslate2 int8: {m['x_unpruned_int8']:.2f}x the unpruned "
                     f"model's int8, batched, equal work (target {SPEEDUP_TARGET}x; FLOP ratio {m['flop_ratio']:.2f};"
                     f" batch 1 {m['x_unpruned_int8_batch1']:.2f}x), {m['x_unpruned_fairseq']:.2f}x unpruned fairseq; "
                     f"BLEU {m['bleu']:.2f}, {m['bleu_loss']:.2f} below unpruned fairseq{_p_clause(m.get('p'))} "
                     f"(target {BLEU_TARGET}): "
                     f"**{'met' if m['met'] else 'missed'}**")
    if p["best"] is None:  # --candidate named a model of another shape
        return lines + [f"candidate {p['candidate']}: not a per-stack model: **no verdict**"]
    lines.append(f"judged: {p['best']['model']}, {p.get('chosen_by', 'the best on this set')}: target "
                 f"**{'met' if p['met'] else 'missed'}**")
    return lines


def write_all(table: Dict, out: str) -> List[str]:
    paths = [os.path.join(out, name) for name in FILES]
    write_json_atomic(paths[0], table)
    with atomic_output(paths[1]) as f:
        f.write(markdown(table))
    deploy_frontier(table["rows"], paths[2], ceilings=table.get("ceilings", ()),
                    target=(SPEEDUP_TARGET, BLEU_TARGET))
    return paths


# --------------------------------------------------------------------------------------------- the study


def shrunk_checkpoint(loaded, options: DeployOptions, out: str, log=print) -> str:
    """The study's own shrink of the model (OUT/models/NAME.pt), reused when its identity (OUT/models/NAME.deploy.json:
    the model, the shrink's options and its calibration data, by content) is this run's."""
    shrink_options = ShrinkOptions(remove=f"{options.shrink_percent:g}%", shape=options.shape,
                                   calibration_subset=options.calibration_subset,
                                   calibration_sentences=options.calibration_sentences)
    os.makedirs(os.path.join(out, MODELS), exist_ok=True)
    path = os.path.join(out, MODELS, options.shrunk_name() + ".pt")
    identity_path = os.path.join(out, MODELS, options.shrunk_name() + ".deploy.json")
    identity = json.loads(json.dumps({  # as stored: tuples at any depth as lists
        "source_sha256": file_sha256(loaded.checkpoint), "options": asdict(shrink_options),
        "calibration_files_sha256": calibration_files_sha256(loaded, options.calibration_subset)}))
    if os.path.exists(path) and os.path.exists(identity_path) and read_json(identity_path) == identity:
        log(f"reusing {path}")
        return path
    if os.path.exists(identity_path):  # the old identity must never vouch for the checkpoint about to replace it
        os.remove(identity_path)
    result, calibration = shrink(loaded, shrink_options, log)
    write_checkpoint(loaded, result, calibration, shrink_options, path, os.path.splitext(path)[0] + ".json", log)
    write_json_atomic(identity_path, identity)  # after the pair: a killed shrink is never taken for a finished one
    set_head_masks(loaded.model, [])
    return path


def run(loaded, options: DeployOptions, out: str, log=print) -> Tuple[Dict, List[str]]:
    """Shrink (if asked), export every model to CTranslate2, time every cell, write OUT/deploy.{json,md,png}."""
    import torch

    options.check()
    check_task(loaded.cfg.task)
    ct2_decoding(loaded.cfg.generation)  # options CTranslate2 cannot apply: refused before any work
    named = options.named_checkpoints()
    set_head_masks(loaded.model, [])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="deploy-") as tmp:
            # every given model loaded and batched first: bad batching or a bad checkpoint is refused before the
            # minutes of the shrink
            contenders = [Contender("unpruned", loaded, options, tmp)]
            ceilings = [Ceiling(shape, contenders[0], tmp) for shape in options.ceiling_shapes()]
            contenders += [Contender(name, load_other(loaded, path), options, tmp) for name, path in named]
            if options.shrink_percent:
                path = shrunk_checkpoint(loaded, options, out, log)
                contenders.insert(1, Contender(options.shrunk_name(), load_other(loaded, path), options, tmp))
            measured = time_cells(contenders, options.runs, options.batch1_sentences, log, ceilings)
            table = build_table(contenders, measured, options, ceilings)
    finally:
        torch.set_num_threads(threads)
    return table, write_all(table, out)
