"""Voita et al. (2019)'s analysis of every head (`fairseq-headprune analyze`): confidence, LRP relevance, and
the functions of encoder self-attention heads (positional, rare-token, syntactic).

Decoder-side statistics are over generation steps, as Voita et al. take them: the subset is translated with
fairseq's beam search (the --beam/--lenpen/... options), then the model is teacher-forced on its own
translations, so that every target position is one generation step and one forward pass gives all of them
(teacher forcing on a prefix computes what incremental decoding computes). Confidence and functions come from
the attention weights of that pass (`attention_capture`); relevance from one backward pass per step of the
same pass (`lrp`); functions and confidence from `head_functions`.

Results: DIR/heads_analysis.json (per type, layer and head: confidence, relevance, function shares, labels;
meta), DIR/heads_analysis-TYPE.png (per-layer bars of confidence and relevance), DIR/head_functions.png (the
function map of encoder self-attention). Each batch's sums are appended to DIR/heads_analysis.partial.jsonl
as it finishes, so a killed run resumes; the file is removed once the JSON is written. A few hundred sentences
take a few minutes on one CPU core.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_headprune.analysis import head_functions as hf
from fairseq_headprune.analysis.attention_capture import capture_attention
from fairseq_headprune.errors import UserError
from fairseq_headprune.decoding.evaluate import SubsetEvaluator, decoder_start
from fairseq_headprune.core.heads import ATTENTION_TYPES, Head, HeadLayout, format_head_spec
from fairseq_headprune.analysis.lrp import (RULE, conservative_propagation, layer_shares, relevance_inputs,
                                            step_head_relevances)
from fairseq_headprune.core.masking import row_head_masks
from fairseq_headprune.records import layout as names
from fairseq_headprune.records.identity import file_sha256, run_identity
from fairseq_headprune.records.log import ResultsLog, write_json_atomic
from fairseq_headprune.studies.ranking import importance_scores
from fairseq_headprune.studies.scoring import frozen_weights
from fairseq_headprune.options import option
from fairseq_headprune import plots
from fairseq_headprune.stats import correlations

RESULTS = names.ANALYSIS
PARTIAL = names.ANALYSIS_PARTIAL
CONFIDENCE = ("mean over queries of the head's maximum attention weight over keys other than EOS; queries: "
              "source tokens other than EOS (enc-self), generation steps (enc-dec), generation steps after the "
              "first (dec-self, whose first step sees only EOS)")
RELEVANCE = ("mean over generation steps of the head's share of its layer's relevance, |R_h| / sum |R_h'|, "
             "R_h from " + RULE)
NO_PARSER = ("syntactic functions skipped: no --source-parses given (a CoNLL-U parse of the raw source "
             "sentences from any dependency parser; none with bundled German weights installs from PyPI here)")


@dataclass
class AnalyzeOptions:
    """What `analyze` reads and how it labels heads; field names are the command's options."""

    subset: str = field(metadata={"flag": "--gen-subset"})
    num_sentences: Optional[int] = option(None, flag="--num-sentences",
                                          help="analyse the first N sentences (by id) of the subset")
    source_parses: Optional[str] = option(
        None, flag="--source-parses", metavar="FILE.conllu",
        help="dependency parses of the subset's raw source sentences, one CoNLL-U sentence per line of the source "
             "(UD labels: nsubj, obj/dobj, amod, advmod); without it no syntactic functions")
    frequency_text: Optional[str] = option(
        None, flag="--frequency-text", metavar="FILE",
        help="training source text to count token frequencies for rare-token heads, encoded with --tokenizer/--bpe if "
             "given (else already in the model's tokens); default: the source dictionary's counts (fairseq's "
             "dict.*.txt count the training set's tokens)")
    importance: Optional[str] = option(
        None, flag="--importance", metavar="importance.json",
        help="importance.json of `score`: correlate relevance with I_h and compare the least important")
    positional_threshold: float = option(
        hf.POSITIONAL_THRESHOLD, flag="--positional-threshold",
        help="share of tokens whose maximum goes to -1 (or +1) for a positional label (Voita et al.: 0.9)")
    rare_threshold: float = option(
        hf.RARE_THRESHOLD, flag="--rare-threshold",
        help="share of tokens whose maximum goes to the rarest token for a rare-token label (Voita et al. give none: "
             "most of the time)")
    syntactic_margin: float = option(
        hf.SYNTACTIC_MARGIN, flag="--syntactic-margin",
        help="accuracy above the positional baseline needed for a syntactic label (Voita et al.: 10 points)")

    def check(self) -> None:
        """Everything that can be refused before the model is loaded."""
        if self.num_sentences is not None and self.num_sentences < 1:
            raise UserError(f"--num-sentences must be at least 1, not {self.num_sentences}")
        for name in ("positional_threshold", "rare_threshold"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise UserError(f"--{name.replace('_', '-')} must be in (0, 1], not {value}")
        if not 0 <= self.syntactic_margin < 1:
            raise UserError(f"--syntactic-margin must be in [0, 1), not {self.syntactic_margin}")
        for name in ("source_parses", "frequency_text", "importance"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise UserError(f"--{name.replace('_', '-')}: no such file: {path}")


# -- inputs -------------------------------------------------------------------------------------------------

def first_sentences(samples: Sequence[dict], n: Optional[int]) -> List[dict]:
    """The batches restricted to sentence ids < n (all of them if n is None); only what decoding needs."""
    out = []
    for sample in samples:
        keep = sample["id"] < n if n is not None else torch.ones_like(sample["id"], dtype=torch.bool)
        if not bool(keep.any()):
            continue
        src = sample["net_input"]["src_tokens"][keep]
        out.append({"id": sample["id"][keep], "nsentences": int(keep.sum()),
                    "net_input": {"src_tokens": src, "src_lengths": sample["net_input"]["src_lengths"][keep]}})
    return out


def token_frequencies(loaded, evaluator: SubsetEvaluator, path: Optional[str]) -> Tuple[torch.Tensor, str]:
    """Training counts of the source vocabulary and where they come from."""
    vocab = loaded.task.source_dictionary
    if not path:
        return torch.tensor(vocab.count, dtype=torch.float64), "source dictionary counts (training set tokens)"
    counts = torch.zeros(len(vocab), dtype=torch.float64)
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if evaluator.tokenizer is not None:
                    line = evaluator.tokenizer.encode(line)
                if evaluator.bpe is not None:
                    line = evaluator.bpe.encode(line)
                for piece in line.split():
                    counts[vocab.index(piece)] += 1
    except OSError as e:
        raise UserError(f"cannot read --frequency-text {path}: {e.strerror}") from None
    if counts.sum() == 0:
        raise UserError(f"--frequency-text {path} holds no tokens")
    return counts, f"counts of {os.path.abspath(path)} (sha256 {file_sha256(path, 16)})"


def read_parses(path: str, size: int, analysed: int) -> List[hf.ParsedSentence]:
    parses = hf.read_conllu(path)
    if len(parses) not in (size, analysed):
        raise UserError(f"--source-parses {path} has {len(parses)} sentences but the subset has {size}"
                        + (f" ({analysed} analysed)" if analysed != size else ""))
    return parses


# -- one batch ----------------------------------------------------------------------------------------------

def _merge(total, part):
    """Add nested dicts/lists of numbers (batch sums) into one."""
    if isinstance(part, dict):
        for k, v in part.items():
            total[k] = _merge(total[k], v) if k in total else v
        return total
    if isinstance(part, list):
        return [_merge(a, b) for a, b in zip(total, part)]
    return total + part


def _name(key) -> str:
    return f"{key[0]}:{key[1]}"


def analyse_batch(loaded, evaluator: SubsetEvaluator, sample: dict, frequencies: torch.Tensor,
                  parses: Optional[Sequence[hf.ParsedSentence]]) -> dict:
    """Translate one batch, teacher-force the translations, and return the batch's sums (JSON-ready)."""
    from fairseq.data import data_utils

    model, task = loaded.model, loaded.task
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    pad, eos = tgt_dict.pad(), tgt_dict.eos()
    with torch.no_grad():
        outputs = task.inference_step(evaluator.generator, [model], sample)
    hyps = [nbest[0]["tokens"] for nbest in outputs]
    texts = {str(sid): evaluator.hypothesis_text(nbest[0]) for sid, nbest in zip(sample["id"].tolist(), outputs)}
    src = sample["net_input"]["src_tokens"]
    prev = data_utils.collate_tokens(hyps, pad, decoder_start(sample, pad, evaluator.generator), left_pad=False,
                                     move_eos_to_beginning=True).to(src.device)
    target = data_utils.collate_tokens(hyps, pad, eos, left_pad=False).to(src.device)
    valid = target.ne(pad)
    net_input = {"src_tokens": src, "src_lengths": sample["net_input"]["src_lengths"], "prev_output_tokens": prev}
    # gradients go to the ξ leaves, embeddings and biases only; the weights' flags are restored afterwards
    with frozen_weights(model), torch.enable_grad(), conservative_propagation(model), \
            capture_attention(model) as captured, relevance_inputs(model) as inputs, \
            row_head_masks(model, src.size(0), requires_grad=True) as leaves:
        logits = model(**net_input)[0]
        top = logits.max(dim=-1)
        relevance, worst = step_head_relevances(top.values, valid, leaves, inputs)
    stats: dict = {
        "sentences": int(src.size(0)),
        "steps": int(valid.sum()),
        "top1_is_hypothesis": int((top.indices.eq(target) & valid).sum()),
        "conservation_worst": worst,
        "hypotheses": texts,
        "confidence": {}, "relevance": {}, "functions": {}, "syntax": {}, "arcs": {},
        "parsed": {"aligned": 0, "unaligned": 0},
    }
    src_keys = src.ne(src_dict.pad()) & src.ne(src_dict.eos())
    steps_after_first = valid & (torch.arange(valid.size(1), device=valid.device) > 0)
    dec_keys = prev.ne(pad) & prev.ne(eos)
    for key, calls in captured.items():
        weights = calls[0]
        queries, keys = {"enc-self": (src_keys, src_keys), "enc-dec": (valid, src_keys),
                         "dec-self": (steps_after_first, dec_keys)}[key[0]]
        total, count = hf.confidence_sums(weights, queries, keys)
        stats["confidence"][_name(key)] = {"sum": total, "count": count}
        r = relevance[key][valid.cpu()]  # (steps, heads)
        stats["relevance"][_name(key)] = {"share_sum": layer_shares(r).sum(0).tolist(), "raw_sum": r.sum(0).tolist(),
                                          "negative": (r < 0).sum(0).tolist(), "steps": int(r.size(0))}
        if key[0] == "enc-self":
            stats["functions"][_name(key)] = hf.positional_rare_counts(weights, src, src_dict.pad(), src_dict.eos(),
                                                                       frequencies)
    if parses is not None:
        _syntax(stats, captured, src, src_dict, sample["id"].tolist(), parses)
    return stats


def _syntax(stats: dict, captured, src: torch.Tensor, src_dict, ids: List[int], parses) -> None:
    layers = sorted(layer for t, layer in captured if t == "enc-self")
    for b, sid in enumerate(ids):
        positions = src[b].ne(src_dict.pad()).nonzero().flatten()
        pieces = [src_dict[i] for i in src[b, positions[:-1]].tolist()]  # the last real position is EOS
        groups = hf.align_surface_to_pieces(parses[sid].surface, pieces)
        if groups is None:
            stats["parsed"]["unaligned"] += 1
            continue
        stats["parsed"]["aligned"] += 1
        word_attn = {}
        for layer in layers:
            weights = captured[("enc-self", layer)][0][:, b][:, positions][:, :, positions]
            word_attn[layer] = hf.word_attention(weights, groups)
        hits, arcs = hf.syntactic_counts(word_attn, parses[sid], groups)
        for layer, per_relation in hits.items():
            _merge(stats["syntax"].setdefault(_name(("enc-self", layer)), {}), per_relation)
        for name, entry in arcs.items():
            _merge(stats["arcs"].setdefault(name, {"n": 0, "offsets": {}}), entry)


# -- aggregation --------------------------------------------------------------------------------------------

def aggregate(rows: Sequence[dict]) -> dict:
    """Sum the batches' rows (the conservation check takes the worst)."""
    total: dict = {}
    worst = 0.0
    for row in rows:
        stats = dict(row["stats"])
        worst = max(worst, stats.pop("conservation_worst"))
        _merge(total, json.loads(json.dumps(stats)))  # a deep copy: _merge adds into the first row's lists
    total["conservation_worst"] = worst
    return total


def _ratio(values: Sequence[float], count: float) -> List[float]:
    return [v / count if count else float("nan") for v in values]


def build_results(total: dict, layout: HeadLayout, options: AnalyzeOptions, meta: dict) -> dict:
    """heads_analysis.json: per type a list of layers, each with its heads' statistics and labels."""
    baselines, baseline_offsets = {}, {}
    for name, entry in total.get("arcs", {}).items():
        baseline_offsets[name], baselines[name] = hf.positional_baseline(entry["offsets"])
    parsed = bool(total.get("parsed", {}).get("aligned"))
    out: dict = {}
    for t in ATTENTION_TYPES:
        out[t] = []
        for layer in layout.layers(t):
            key = f"{t}:{layer}"
            conf, rel = total["confidence"][key], total["relevance"][key]
            confidence = _ratio(conf["sum"], conf["count"])
            share = _ratio(rel["share_sum"], rel["steps"])
            signed = _ratio(rel["raw_sum"], rel["steps"])
            negative = _ratio(rel["negative"], rel["steps"])
            heads = []
            for i, h in enumerate(layout.heads[(t, layer)]):
                entry = {"head": h, "confidence": confidence[i], "relevance": share[i],
                         "relevance_mean_signed": signed[i], "relevance_negative_steps": negative[i]}
                if t == "enc-self":
                    fn = total["functions"][key]
                    functions = {"prev": fn["prev"][i] / fn["queries"], "next": fn["next"][i] / fn["queries"],
                                 "rare": fn["rare"][i] / fn["queries"]}
                    syntactic = {}
                    if parsed:
                        for name in hf.RELATION_KEYS:
                            n = total["arcs"].get(name, {}).get("n", 0)
                            hits = total["syntax"].get(key, {}).get(name)
                            if n and hits:
                                syntactic[name] = hits[i] / n
                        functions["syntactic"] = syntactic
                    entry["functions"] = functions
                    entry["labels"] = hf.head_labels(functions["prev"], functions["next"], functions["rare"],
                                                     syntactic, baselines, options.positional_threshold,
                                                     options.rare_threshold, options.syntactic_margin)
                heads.append(entry)
            out[t].append({"layer": layer, "heads": heads})
    out["summary"] = _summary(out, layout)
    out["meta"] = {**meta,
                   "thresholds": {"positional": options.positional_threshold, "rare": options.rare_threshold,
                                  "syntactic_margin_over_baseline": options.syntactic_margin},
                   "syntactic": ({"relations": {name: {"arcs": total["arcs"][name]["n"],
                                                       "baseline_offset": baseline_offsets[name],
                                                       "baseline_accuracy": baselines[name]}
                                                for name in hf.RELATION_KEYS if name in total["arcs"]},
                                  "sentences_aligned": total["parsed"]["aligned"],
                                  "sentences_not_aligned": total["parsed"]["unaligned"]}
                                 if parsed else {"skipped": meta.get("syntactic_skipped", NO_PARSER)})}
    return out


def _summary(out: dict, layout: HeadLayout) -> dict:
    labelled: Dict[str, List[Head]] = {"positional": [], "rare": [], "syntactic": []}
    for entry in out["enc-self"]:
        for head in entry["heads"]:
            h = Head("enc-self", entry["layer"], head["head"])
            for kind in labelled:
                if any(label.startswith(kind) for label in head["labels"]):
                    labelled[kind].append(h)
    summary = {kind: {"count": len(heads), "heads": format_head_spec(heads)} for kind, heads in labelled.items()}
    for t in ATTENTION_TYPES:
        conf = [h["confidence"] for e in out[t] for h in e["heads"]]
        rel = [h["relevance"] for e in out[t] for h in e["heads"]]
        summary[t] = {"confidence_min": min(conf), "confidence_max": max(conf), "relevance_min": min(rel),
                      "relevance_max": max(rel)}
        if len(conf) > 2:  # Voita et al.: the most relevant heads are the confident ones
            summary[t]["confidence_vs_relevance"] = correlations(conf, rel)
    return summary


def compare_importance(results: dict, path: str) -> dict:
    """Relevance vs Michel et al.'s I_h per type: Pearson/Spearman, and how many of the quarter of heads with
    the lowest relevance are also in the quarter with the lowest I_h."""
    scores = importance_scores(path)
    out = {"importance": os.path.abspath(path)}
    for t in ATTENTION_TYPES:
        heads = [(Head(t, e["layer"], h["head"]), h["relevance"]) for e in results[t] for h in e["heads"]]
        missing = [str(h) for h, _ in heads if h not in scores]
        if missing:
            raise UserError(f"--importance {path} has no score for head {missing[0]}: it is of another model")
        rel = [r for _, r in heads]
        imp = [scores[h] for h, _ in heads]
        quarter = max(1, len(heads) // 4)
        low_rel = {h for h, _ in sorted(heads, key=lambda x: x[1])[:quarter]}
        low_imp = {h for h, _ in sorted(heads, key=lambda x: scores[x[0]])[:quarter]}
        out[t] = {**correlations(rel, imp), "lowest_quarter": quarter, "lowest_quarter_overlap": len(low_rel & low_imp),
                  "lowest_quarter_overlap_heads": format_head_spec(low_rel & low_imp)}
    return out


# -- command ------------------------------------------------------------------------------------------------

def header(loaded, evaluator: SubsetEvaluator, analysed: int, frequency_source: str,
           options: AnalyzeOptions) -> dict:
    """The run identity of the partial results (batches are the rows' keys: batching is part of it here)."""
    cfg = loaded.cfg
    return run_identity(
        "analyze", loaded, evaluator, sentences=analysed,
        batching={"max_tokens": cfg.dataset.max_tokens, "batch_size": cfg.dataset.batch_size},
        frequencies=frequency_source,
        source_parses=(f"{os.path.abspath(options.source_parses)} (sha256 {file_sha256(options.source_parses, 16)})"
                       if options.source_parses else None),
        thresholds=[options.positional_threshold, options.rare_threshold, options.syntactic_margin])


def run(loaded, options: AnalyzeOptions, results_dir: str, progress=None) -> List[str]:
    """heads_analysis.json and its figures in DIR (batches resumable); returns the files written."""
    options.check()
    if options.importance:  # a bad or foreign importance file is refused now, not after the analysis
        importance_scores(options.importance, file_sha256(loaded.checkpoint))
    evaluator = SubsetEvaluator(loaded, options.subset)
    samples = first_sentences(evaluator.samples, options.num_sentences)
    analysed = sum(s["nsentences"] for s in samples)
    frequencies, frequency_source = token_frequencies(loaded, evaluator, options.frequency_text)
    parses = read_parses(options.source_parses, evaluator.size, analysed) if options.source_parses else None
    hdr = header(loaded, evaluator, analysed, frequency_source, options)
    out_path = os.path.join(results_dir, RESULTS)
    partial = os.path.join(results_dir, PARTIAL)
    log = ResultsLog(partial, hdr)
    done = log.done()
    for b, sample in enumerate(progress(samples) if progress else samples):
        if b not in done:
            log.append({"key": b, "stats": analyse_batch(loaded, evaluator, sample, frequencies, parses)})
    total = aggregate(log.rows)
    hypotheses = total.pop("hypotheses")
    ids = sorted(int(k) for k in hypotheses)
    bleu = evaluator.bleu_metric().corpus_score([hypotheses[str(i)] for i in ids],
                                                [[evaluator.references[i] for i in ids]])
    layout = HeadLayout.of(loaded.model)
    meta = {**hdr, "checkpoint": os.path.abspath(loaded.checkpoint), "data": os.path.abspath(loaded.cfg.task.data),
            "generation_steps": total["steps"], "bleu_of_analysed_translations": round(bleu.score, 2),
            "top1_equals_beam_token": total["top1_is_hypothesis"] / max(1, total["steps"]),
            "lrp_rule": RULE, "lrp_conservation_max_relative_error": total["conservation_worst"],
            "confidence_definition": CONFIDENCE, "relevance_definition": RELEVANCE,
            "frequency_definition": "rarest token of a sentence by " + frequency_source}
    results = build_results(total, layout, options, meta)
    if options.importance:
        results["summary"]["importance_comparison"] = compare_importance(results, options.importance)
    write_json_atomic(out_path, results)
    figures = [plots.head_confidence_relevance(results[t], t, os.path.join(results_dir, f"heads_analysis-{t}.png"))
               for t in ATTENTION_TYPES]
    syntactic = results["meta"]["syntactic"]
    baselines = ({name: r["baseline_accuracy"] for name, r in syntactic["relations"].items()}
                 if "relations" in syntactic else None)
    figures.append(plots.head_function_map(results["enc-self"], baselines,
                                           os.path.join(results_dir, "head_functions.png")))
    os.unlink(partial)  # everything it held is in the JSON now
    print(format_report(results))
    return [out_path, *figures]


def format_report(results: dict) -> str:
    meta, summary = results["meta"], results["summary"]
    lines = [f"{meta['sentences']} sentences of {meta['subset']}, {meta['generation_steps']} generation steps "
             f"(BLEU {meta['bleu_of_analysed_translations']}); LRP conservation error at most "
             f"{meta['lrp_conservation_max_relative_error']:.1e}"]
    for t in ATTENTION_TYPES:
        s = summary[t]
        corr = s.get("confidence_vs_relevance")
        lines.append(f"{t:<9} confidence {s['confidence_min']:.2f}..{s['confidence_max']:.2f}, "
                     f"relevance share {s['relevance_min']:.3f}..{s['relevance_max']:.3f}"
                     + (f", Spearman(confidence, relevance) {corr['spearman_r']:.2f}" if corr else ""))
    for kind in ("positional", "rare", "syntactic"):
        lines.append(f"{kind} heads: {summary[kind]['count']}"
                     + (f" ({summary[kind]['heads']})" if summary[kind]["heads"] else ""))
    if "skipped" in meta["syntactic"]:
        lines.append(meta["syntactic"]["skipped"])
    comparison = summary.get("importance_comparison")
    if comparison:
        for t in ATTENTION_TYPES:
            c = comparison[t]
            lines.append(f"{t:<9} relevance vs I_h: Spearman {c['spearman_r']:.2f} (p {c['spearman_p']:.2g}); "
                         f"lowest quarter shared: {c['lowest_quarter_overlap']}/{c['lowest_quarter']}")
    return "\n".join(lines)

