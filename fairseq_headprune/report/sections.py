"""The sections of `fairseq-headprune report`: each one is fed by the result files of its part and says how to
produce them when they are missing. Figures the commands wrote are embedded as they are; the few the report
draws itself (importance maps, curves split by kind, dynamics) go through plots.py into DIR/report-*.png.
"""
from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass
from statistics import mean
from typing import Dict, List, Optional, Sequence

from fairseq_headprune.report import claims as cl
from fairseq_headprune.report.document import Document
from fairseq_headprune.errors import UserError
from fairseq_headprune.core.heads import ATTENTION_TYPES, TYPE_DESCRIPTIONS
from fairseq_headprune.records import layout as names
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.records.log import read_json
from fairseq_headprune.records.rows import best_per_layer
from fairseq_headprune import plots
from fairseq_headprune.plots import dynamics_figure, head_heatmap, pruning_curves
from fairseq_headprune.studies import deploy as study, frontier, recover_table, shrink_sweep as sweep
from fairseq_headprune.studies.ranking import importance_scores

VERDICT_CLASS = {cl.SUPPORTED: "verdict-supported", cl.NOT_SUPPORTED: "verdict-not-supported",
                 cl.NOT_RUN: "verdict-not-run", cl.INCOMPLETE: "verdict-incomplete"}
DYNAMICS_COMMAND = ("bash recipes/iwslt_dynamics.sh multi30k ../shared/data WORK  # a training run and its dynamics;"
                    " then: fairseq-headprune report ... --dynamics WORK/dynamics/dynamics.jsonl")
VOITA_COMMAND = "bash recipes/voita_l0.sh  # then: fairseq-headprune report ... --l0-sweep results/voita/compare.jsonl"


@dataclass
class Files:
    out: str
    dynamics_path: Optional[str]
    l0_path: Optional[str]
    keep_one_select: str = "bleu"  # report --keep-one-select
    gen_subset: str = "test"
    l0_encoder_path: Optional[str] = None  # the L0 sweep with encoder self-attention gated alone
    whose: Optional[Dict[str, str]] = None  # "dynamics", "l0", "l0_encoder" -> whose file it is, when not this model's

    def __post_init__(self):
        j = lambda name: os.path.join(self.out, name)  # noqa: E731
        self.importance = j("importance.json")
        self.single = j("ablation-single.jsonl")
        # keep-one's BLEU rows: every head of every layer, or (loss) the NLL-chosen head of each layer
        self.keep_one = j("ablation-keep-one.jsonl" if self.keep_one_select == "bleu"
                          else names.keep_one_report_name("loss", self.gen_subset, "bleu") + ".jsonl")
        self.keep_one_selection = j("ablation-keep-one-loss.jsonl") if self.keep_one_select == "loss" else None
        self.pruning = j("pruning.jsonl")
        self.speed = j("speed.json")
        self.analysis = j("heads_analysis.json")

    def figure(self, name: str) -> str:
        return os.path.join(self.out, name)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def _header_of(path: str) -> Dict:
    return cl.read_jsonl(path)[0] if os.path.exists(path) else {}


def bootstrap_settings(header: Dict) -> str:
    """The significance settings a verdict used, as the tables print them beside it."""
    boot = header.get("bootstrap") or {}
    ratio = boot.get("sample_ratio", 1.0)
    size = ("full-size resamples" if ratio == 1 else
            f"resamples of {ratio:g} x the set" + (" (compare-mt's default, as Michel et al. presumably ran it)"
                                                   if ratio == 0.5 else ""))
    return (f"compare-mt paired bootstrap, {boot.get('samples')} {size}, seed {boot.get('seed')}, one-sided "
            f"p < {boot.get('significance')}")


def _model_marker(path: str) -> Optional[str]:
    """The model a training run ended in, for its dynamics: `.model-sha256` beside the file."""
    marker = os.path.join(os.path.dirname(os.path.abspath(path)), ".model-sha256")
    if not os.path.isfile(marker):
        return None
    with open(marker, encoding="utf-8") as f:
        return f.read().strip() or None


def checkpoints_named(path: str) -> set:
    """The checkpoints (sha256) a result file of another study names: its header's, its rows' (a training run's
    epochs) and, for a training run's dynamics, the model the run ended in (`.model-sha256` beside the file)."""
    header, rows = cl.read_jsonl(path)
    named = {r["checkpoint_sha256"] for r in (header, *rows) if isinstance(r.get("checkpoint_sha256"), str)}
    return named | ({_model_marker(path)} - {None})


def whose(path: Optional[str], checkpoint_sha: str) -> Optional[str]:
    """None when the input file is this checkpoint's (or not there); else whose it is, in words, for the report to
    say beside every number it gives from it: a file of another model is read only when the user names it."""
    if not path or not os.path.isfile(path):
        return None
    named = checkpoints_named(path)
    if checkpoint_sha in named:
        return None
    header, _ = cl.read_jsonl(path)
    if not named:
        return f"from `{path}`, a file that names no checkpoint: not known to be this model's"
    ended = _model_marker(path)
    if header.get("checkpoint_dir"):  # a training run's dynamics: one checkpoint per epoch
        return (f"from `{path}`, another model's training run (its epoch checkpoints in `{header['checkpoint_dir']}`"
                + (f", ended in checkpoint {ended[:12]}" if ended else "") + "), not this model's")
    model = header.get("checkpoint_sha256") or ended or sorted(named)[0]
    return f"from `{path}`, a file of another model (checkpoint {model[:12]}), not this one"


def _missing(doc: Document, what: str, lines: Sequence[str]) -> None:
    doc.paragraph(f"Not run yet: no {what}. The command that produces it (and resumes it when interrupted):")
    doc.code("\n".join(lines))


def _provenance(doc: Document, part, state) -> None:
    seconds = state.seconds(part.name)
    when = f"computed in {_duration(seconds)} (wall clock) by" if seconds else "produced or resumed by"
    doc.paragraph(f"Results {when}:")
    doc.code("\n".join(state.commands(part)))


# ---------------------------------------------------------------- header and claims

def header(doc: Document, files: Files, cfg, args, state, layout) -> None:

    ckpt = cfg.common_eval.path
    g = cfg.generation
    baseline = next((r for r in (cl.read_rows(files.single) or []) if r.get("key") == "baseline"), None)
    sentences = f"{len(baseline['hypotheses'])} sentences" if baseline and "hypotheses" in baseline else "sentences"
    lines = [
        f"**Model**: `{ckpt}` (sha256 {file_sha256(ckpt)[:12]}), {layout.describe()}.",
        f"**Data**: `{cfg.task.data}`, subset `{cfg.dataset.gen_subset}` ({sentences}); references: "
        f"`{args.references or 'the binarised targets, decoded'}`; I_h computed on subset "
        f"`{args.importance_subset or cfg.dataset.gen_subset}`.",
        f"**Decoding**: beam {g.beam}, length penalty {g.lenpen}, max length {g.max_len_a}·src + {g.max_len_b}.",
    ]
    signatures = sorted({h.get("bleu_signature") for h in map(_header_of, (files.single, files.keep_one, files.pruning))
                         if h.get("bleu_signature")})
    if signatures:
        lines.append("**sacreBLEU**: " + "; ".join(f"`{s}`" for s in signatures) + ".")
    if baseline and "bleu" in baseline:
        lines.append(f"**Unpruned model**: {baseline['bleu']:.2f} BLEU on this subset.")
    if args.note:
        lines.append(f"**Note**: {args.note}")
    total = sum(v.get("seconds", 0) for v in state.data["parts"].values())
    lines.append(f"Written {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} by `fairseq-headprune report`; "
                 f"the parts' wall-clock time recorded in `{os.path.basename(state.path)}`: {_duration(total)}.")
    doc.bullets(lines)


def evaluate_claims(files: Files, parts: Dict, layout, args) -> List[cl.Claim]:
    single = cl.read_rows(files.single)
    pruning = cl.read_rows(files.pruning)
    per_layer = {key: len(heads) for key, heads in layout.heads.items()}
    l0_points, l0_source = read_l0_sweep(files.l0_path)
    encoder_points, encoder_source = read_l0_sweep(files.l0_encoder_path, "--l0-encoder-sweep")
    owners = files.whose or {}
    dynamics = cl.claim_dynamics(cl.read_rows(files.dynamics_path), DYNAMICS_COMMAND, source=files.dynamics_path or "")
    dynamics.whose = owners.get("dynamics") if dynamics.verdict != cl.NOT_RUN else None
    voita = cl.claim_voita(l0_points, VOITA_COMMAND, source=l0_source, encoder_only=encoder_points,
                           encoder_source=encoder_source)
    voita_owners = [owners.get(k) for k, points in (("l0", l0_points), ("l0_encoder", encoder_points))
                    if points and owners.get(k)]
    voita.whose = "; ".join(voita_owners) or None
    return [
        cl.claim_single_heads(single, len(layout.all_heads()), parts["single"].lines()[0]),
        cl.claim_keep_one(cl.read_rows(files.keep_one), len(per_layer), parts["keep-one"].lines()[0],
                          os.path.basename(files.keep_one), keep_one_tried(files, layout), files.keep_one_select),
        cl.claim_prunable(pruning, parts["prune"].lines()[0]),
        cl.claim_enc_dec_sensitive(pruning, single, "\n".join(parts["prune-types"].lines())),
        dynamics,
        cl.claim_speed(read_json(files.speed), parts["speed"].lines()[0]),
        voita,
    ]


def keep_one_tried(files: Files, layout) -> Dict:
    """The keep-one rows each layer needs to be complete: every head tried, or (NLL-selected) its chosen head."""
    return {key: 1 if files.keep_one_selection else len(heads) for key, heads in layout.heads.items()}


def read_l0_sweep(path: Optional[str], option: str = "--l0-sweep"):
    """(points, source) of Voita's λ sweep, or (None, '') when not given or not there."""
    if not path:
        return None, ""
    try:
        return cl.l0_points(path), path
    except (OSError, ValueError) as e:
        raise UserError(f"{option} {path}: {e}") from None


def claims_table(doc: Document, rows: Sequence[cl.Claim]) -> None:
    doc.heading("The papers' claims, checked")
    doc.paragraph("Each verdict is computed from the result files by the rule listed under the table; the paper's "
                  "number is quoted from the paper (other models and data: Michel et al. used WMT En-Fr and BERT, "
                  "Voita et al. WMT En-Ru), ours is this model's unless the row says whose file it comes from.")
    doc.table(["", "claim", "paper", "ours", "verdict"],
              [[c.id, c.claim, c.paper, c.ours + (f" (**{c.whose}**)" if c.whose else ""), f"**{c.verdict}**"]
               for c in rows],
              [VERDICT_CLASS[c.verdict] for c in rows])
    doc.bullets([f"{c.id}: {c.rule}" + (f" (from `{', '.join(c.sources)}`)" if c.sources else "") for c in rows])
    todo = [c for c in rows if c.verdict in (cl.NOT_RUN, cl.INCOMPLETE) and c.command]
    if todo:
        doc.paragraph("To complete the table:")
        doc.code("\n".join(f"# {c.id}\n{c.command}" for c in todo))


# ---------------------------------------------------------------- parts

def importance(doc: Document, files: Files, part, state) -> None:
    doc.heading("Head importance I_h")
    data = read_json(files.importance)
    if data is None:
        _missing(doc, "importance.json", part.lines())
        return
    meta = data.get("meta", {})
    nll = meta.get("nll_per_token", float("nan"))
    doc.paragraph(f"{meta.get('definition', '')}. Subset `{meta.get('subset')}`: {meta.get('sentences')} sentences, "
                  f"{meta.get('target_tokens')} target tokens, NLL {nll:.3f}/token; "
                  f"{'l2-normalised per layer' if meta.get('normalized_by_layer') else 'raw'}.")
    scores = importance_scores(files.importance)
    for t in ATTENTION_TYPES:
        values = {(h.layer, h.head): v for h, v in scores.items() if h.type == t}
        if values:
            path = head_heatmap(values, {}, f"{t}: head importance I_h", "I_h",
                                files.figure(f"report-importance-{t}.png"))
            doc.image(path, f"I_h of every {TYPE_DESCRIPTIONS[t]} head (rows: layers, columns: heads)")
    _provenance(doc, part, state)


def _change(row: Dict) -> str:
    return f"**{row['delta']:+.2f}**" if row.get("significant") else f"{row['delta']:+.2f}"


def _grid(rows: Sequence[Dict], t: str) -> List[List[str]]:
    by_pos = {(r["layer"], r["head"]): r for r in rows if r["type"] == t}
    heads = sorted({h for _, h in by_pos})
    out = []
    for layer in sorted({layer for layer, _ in by_pos}):
        cells = []
        for h in heads:
            r = by_pos.get((layer, h))
            cells.append("" if r is None else _change(r))
        out.append([str(layer)] + cells)
    return out


def single(doc: Document, files: Files, part, state, layout) -> None:
    doc.heading("Single-head ablation (Michel et al. Table 1)")
    rows = cl.read_rows(files.single)
    if rows is None:
        _missing(doc, "ablation-single.jsonl", part.lines())
        return
    header = _header_of(files.single)
    base = next((r for r in rows if r.get("key") == "baseline"), None)
    heads = [r for r in rows if r.get("key") != "baseline"]
    doc.paragraph(f"Each head masked alone; BLEU change against the unpruned model ({base['bleu']:.2f} BLEU)"
                  if base else "Each head masked alone.")
    doc.paragraph(f"{len(heads)} of {len(layout.all_heads())} heads done. **Bold**: significant "
                  f"({bootstrap_settings(header)}).")
    summary = []
    for t in ATTENTION_TYPES:
        mine = [r for r in heads if r["type"] == t]
        if not mine:
            continue
        worst = min(mine, key=lambda r: r["delta"])
        summary.append([t, str(len(mine)), str(sum(r.get("significant", False) and r["delta"] < 0 for r in mine)),
                        str(sum(r.get("significant", False) and r["delta"] > 0 for r in mine)),
                        f"{mean(r['delta'] for r in mine):+.3f}", f"{t}:{worst['layer']}:{worst['head']} "
                        f"{worst['delta']:+.2f}"])
    doc.table(["type", "heads", "significant drops", "significant gains", "mean change", "worst head"], summary)
    for t in ATTENTION_TYPES:
        grid = _grid(heads, t)
        if not grid:
            continue
        doc.heading(f"{TYPE_DESCRIPTIONS[t]} ({t})", 3)
        figure = files.figure(f"ablation-single-{t}.png")
        if os.path.exists(figure):
            doc.image(figure, f"BLEU change when one {TYPE_DESCRIPTIONS[t]} head is masked (* significant)")
        doc.table(["layer"] + [str(h) for h in sorted({r["head"] for r in heads if r["type"] == t})], grid)
    _provenance(doc, part, state)


def keep_one(doc: Document, files: Files, part, state, layout=None) -> None:
    doc.heading("One head per layer (Michel et al. Tables 2/3)")
    rows = cl.read_rows(files.keep_one)
    if rows is None:
        _missing(doc, os.path.basename(files.keep_one), part.lines())
        return
    base = next((r for r in rows if r.get("key") == "baseline"), None)
    bleu = f" ({base['bleu']:.2f} BLEU)" if base else ""
    if files.keep_one_selection:
        header = _header_of(files.keep_one)
        chosen_on, subset = header.get("selected_on"), header.get("subset")
        selection = {r["key"]: r for r in cl.read_rows(files.keep_one_selection) or [] if "nll" in r}
        doc.paragraph(f"One layer at a time keeps a single head, all other layers intact. Each layer's head was "
                      f"chosen by the lowest teacher-forced NLL on `{chosen_on}` (every head tried, a fast preview), "
                      f"and only the chosen head was decoded and scored by BLEU on `{subset}`. BLEU change against "
                      f"the unpruned model{bleu}; **bold**: significant ({bootstrap_settings(header)}).")
        table = []
        for r in best_per_layer(rows):
            nll = selection.get(r["key"], {}).get("delta")
            table.append([r["type"], str(r["layer"]), str(r["head"]), "" if nll is None else f"{nll:+.3f}",
                          f"{r['bleu']:.2f}", _change(r)])
        doc.table(["type", "layer", "chosen head", f"NLL change on {chosen_on}", f"BLEU on {subset}", "change"],
                  table)
        if layout is not None:
            doc.paragraph(f"{len(table)} of {len(layout.heads)} layers done.")
    else:
        doc.paragraph("One layer at a time keeps a single head (each head tried; the best one shown), all other "
                      f"layers intact. Change against the unpruned model{bleu}; **bold**: significant.")
        table = []
        for r in best_per_layer(rows):
            table.append([r["type"], str(r["layer"]), str(r["head"]), f"{r['bleu']:.2f}", _change(r)])
        doc.table(["type", "layer", "best head", "BLEU", "change"], table)
    _provenance(doc, part, state)


def pruning(doc: Document, files: Files, part, types_part, state) -> None:
    doc.heading("Pruning curves (Michel et al. Figures 3/4)")
    rows = cl.read_rows(files.pruning)
    if rows is None:
        _missing(doc, "pruning.jsonl", part.lines() + types_part.lines())
        return
    rows = [r for r in rows if "percent_pruned" in r]
    whole = [r for r in rows if set(r["types"]) == set(ATTENTION_TYPES)]
    alone = [r for r in rows if len(r["types"]) == 1]
    doc.paragraph("Heads masked 10% more at a time (by `--step`), least important first: by I_h (importance), by "
                  "the single-head ablation's BLEU change (oracle), or in a seeded random order.")
    for label, subset, name in (("whole model", whole, "model"), ("each attention type alone, by importance", alone,
                                                                  "types")):
        if not subset:
            continue
        doc.heading(label[0].upper() + label[1:], 3)
        path = pruning_curves(subset, files.figure(f"report-pruning-{name}.png"))
        doc.image(path, f"BLEU against the % of heads pruned: {label}")
        curves = sorted({f"{r['order']} ({', '.join(r['types'])})" for r in subset})
        cell = {(f"{r['order']} ({', '.join(r['types'])})", round(r["percent_pruned"])): r["bleu"] for r in subset}
        percents = sorted({round(r["percent_pruned"]) for r in subset})
        doc.table(["% pruned"] + curves,
                  [[f"{p}%"] + [f"{cell[(c, p)]:.2f}" if (c, p) in cell else "" for c in curves] for p in percents])
    _provenance(doc, part, state)
    if alone:
        _provenance(doc, types_part, state)
    elif whole:
        doc.paragraph("No per-type curves yet:")
        doc.code("\n".join(types_part.lines()))


def speed(doc: Document, files: Files, part, state) -> None:
    doc.heading("Speed of pruned models (Michel et al. Table 4)")
    data = read_json(files.speed)
    if data is None:
        _missing(doc, "speed.json", part.lines())
        return
    doc.paragraph(f"{data['heads_pruned']} of {data['heads_total']} heads removed (the importance order's choice). "
                  f"Unpruned, masked (heads zeroed: the pruned model's translations at the unpruned model's cost) "
                  f"and physically pruned models decode the same sentences of `{data['subset']}` (beam "
                  f"{data['beam']}, {data['threads']} thread(s)); sentences/s mean ± standard deviation over runs. "
                  f"**Pruned vs masked is the equal-work speed-up**: both write identical translations (checked: "
                  f"the same number of tokens in every run), so only the removed heads' work differs; it is the "
                  f"figure the claims use, beside the FLOP ratio of the same sentences and lengths. Pruned vs "
                  f"unpruned (tokens/s) also carries the change in what is translated (hypothesis lengths, when "
                  f"beams finish), so it is not a speed-up of the same work.")
    table = []
    for b in sorted(data["batch_sizes"], key=int):
        row = data["batch_sizes"][b]
        cells = [f"{row[n]['sentences_per_s']:.1f} ± {row[n]['sentences_per_s_std']:.1f}"
                 for n in ("unpruned", "masked", "pruned")]
        state_kib = f"{row['unpruned']['incremental_state_bytes'] / 1024:.0f} → " \
                    f"{row['pruned']['incremental_state_bytes'] / 1024:.0f} KiB"
        pruned = row["pruned"]
        over_masked = pruned.get("speedup_over_masked")
        equal = (f"x{over_masked:.3f} ± {pruned.get('speedup_over_masked_std', 0):.3f}"
                 + ("" if pruned.get("same_tokens_as_masked", True) else " (hypotheses differ!)")
                 if over_masked else "")
        table.append([b] + cells + [equal, f"x{pruned['speedup']:.3f}", state_kib])
    doc.table(["batch", "unpruned sent/s", "masked sent/s", "pruned sent/s", "pruned vs masked (equal work)",
               "pruned vs unpruned (tokens/s, not equal work)", "decoder state"], table)
    params = data.get("params", {})
    ratio = data.get("flop_ratio", data.get("flop_bound_speedup"))
    doc.paragraph(f"FLOP ratio, unpruned over pruned, on the same sentences and hypothesis lengths "
                  f"(fairseq_headprune.core.flops: encoder-decoder keys and values projected for every beam row; "
                  f"the per-step reorder of the key/value cache is a copy, counted apart, not as FLOPs): "
                  f"x{ratio or 0:.3f}. It is what the "
                  f"speed-up would be if time followed the arithmetic, not a bound"
                  + (f"; the reorder copies x{data['reorder_ratio']:.3f} fewer elements in the pruned model, so "
                     f"where time is memory traffic the speed-up can exceed the FLOP ratio"
                     if data.get("reorder_ratio") else "")
                  + f". Parameters: {params.get('unpruned', 0):,} unpruned, {params.get('pruned', 0):,} pruned.")
    _provenance(doc, part, state)


def dynamics(doc: Document, files: Files) -> None:
    doc.heading("Training dynamics (Michel et al. Figure 5)")
    rows = cl.read_rows(files.dynamics_path)
    if not rows:
        doc.paragraph(f"No dynamics results at `{files.dynamics_path}` (option `--dynamics`). They come from the "
                      "epoch checkpoints of a training run:")
        doc.code(DYNAMICS_COMMAND)
        return
    header = _header_of(files.dynamics_path)
    doc.paragraph(f"From `{files.dynamics_path}` (a copy of `--dynamics`): each epoch's checkpoint pruned by its "
                  f"own I_h (on "
                  f"`{header.get('importance_subset')}`), BLEU on `{header.get('subset')}`, as % of that epoch's "
                  f"unpruned BLEU. This file is an input of the report, not one of its parts: the bundled model's "
                  f"comes from its training run (`recipes/iwslt_dynamics.sh`)."
                  + (f" **Not this model's: {(files.whose or {})['dynamics']}.**"
                     if (files.whose or {}).get("dynamics") else ""))
    path = dynamics_figure(rows, files.figure("report-dynamics.png"))
    doc.image(path, "% of each epoch's BLEU kept against the % of heads pruned; right: unpruned BLEU per epoch")
    epochs = sorted({r["epoch"] for r in rows if "epoch" in r})
    percents = sorted({round(r["percent_pruned"]) for r in rows if "epoch" in r})
    cell = {(r["epoch"], round(r["percent_pruned"])): r for r in rows if "epoch" in r}
    table = []
    for e in epochs:
        base = cell.get((e, 0), {}).get("bleu")
        table.append([str(e), f"{base:.2f}" if base is not None else ""]
                     + [f"{cell[(e, p)]['bleu_retained']:.0f}" if (e, p) in cell else "" for p in percents])
    doc.table(["epoch", "BLEU"] + [f"{p}%" for p in percents], table)


def voita(doc: Document, files: Files) -> None:
    doc.heading("Voita et al.: L0 gates")
    points, source = read_l0_sweep(files.l0_path)
    encoder_points, encoder_source = read_l0_sweep(files.l0_encoder_path, "--l0-encoder-sweep")
    if not points and not encoder_points:
        where = f" at `{files.l0_path}`" if files.l0_path else " (option `--l0-sweep`)"
        doc.paragraph(f"No L0 λ sweep{where}. It comes from fine-tuning the model with a Hard Concrete gate on "
                      "every head for several λ:")
        doc.code(VOITA_COMMAND)
        return
    for l0_points, where, option, what in ((points, source, "--l0-sweep", _gated_types(points)),
                                       (encoder_points, encoder_source, "--l0-encoder-sweep",
                                        "encoder self-attention gated alone (Voita's main experiment)")):
        if not l0_points:
            continue
        owner = (files.whose or {}).get("l0" if option == "--l0-sweep" else "l0_encoder")
        if owner:
            doc.paragraph(f"**Not this model's: {owner}.**")
        doc.paragraph(f"{what[0].upper() + what[1:]}: from `{where}` (a copy of `{option}`, made by "
                      "`fairseq-headprune compare`): the unpruned model; each L0 fine-tuned model (heads kept: "
                      "gates not closed) against the unpruned model and against the λ = 0 control (the same "
                      "fine-tuning without the penalty); Michel et al.'s I_h masks on the unpruned model at the "
                      "same numbers of heads (no retraining, so not like for like).")
        _l0_table(doc, l0_points)
        for name in cl.l0_figures(where):
            doc.image(name, f"from {os.path.basename(name)}")


def _gated_types(points: Optional[Sequence[Dict]]) -> str:
    """What an L0 sweep gated, from its runs' `types` (compare.jsonl's)."""
    types = {t for p in points or [] if p["method"] == "l0" for t in p.get("types") or []}
    if not types or types >= set(ATTENTION_TYPES):
        return "every head gated"
    return ", ".join(t for t in ATTENTION_TYPES if t in types) + " gated"


def _l0_table(doc: Document, points: Sequence[Dict]) -> None:
    base = next((p["bleu"] for p in points if p["method"] == "unpruned"), None)
    control = next((p["bleu"] for p in points if p["method"] == "l0" and p.get("lambda") == 0), None)
    order = {"unpruned": 0, "l0": 1, "michel": 2}

    def change(p: Dict, reference: Optional[float]) -> str:
        return f"{p['bleu'] - reference:+.2f}" if reference is not None else ""

    def encoder(p: Dict) -> str:
        kept = p.get("kept_per_type") or {}
        return f"{kept['enc-self']}" if "enc-self" in kept else ""

    doc.table(["method", "λ", "heads kept", "enc-self kept", "BLEU", "vs unpruned", "vs λ = 0 control"],
              [[p["method"], "" if p.get("lambda") is None else str(p["lambda"]),
                f"{p['heads_kept']}/{p['heads_total']}", encoder(p), f"{p['bleu']:.2f}", change(p, base),
                change(p, control) if p["method"] == "l0" and p.get("lambda") != 0 else ""]
               for p in sorted(points, key=lambda p: (order.get(p["method"], 3), -p["heads_kept"]))])


def analysis(doc: Document, files: Files, part, state) -> None:
    doc.heading("What the heads do (Voita et al.: confidence, relevance, functions)")
    data = read_json(files.analysis)
    if data is None:
        _missing(doc, "heads_analysis.json", part.lines())
        return
    meta, summary = data.get("meta", {}), data.get("summary", {})
    doc.paragraph(f"{meta.get('sentences', '?')} sentences of `{meta.get('subset', '?')}`, "
                  f"{meta.get('generation_steps', '?')} generation steps. Confidence: "
                  f"{meta.get('confidence_definition', '')}. Relevance: {meta.get('relevance_definition', '')}.")
    table = []
    for t in ATTENTION_TYPES:
        s = summary.get(t)
        if s:
            table.append([t, f"{s['confidence_min']:.2f}..{s['confidence_max']:.2f}",
                          f"{s['relevance_min']:.3f}..{s['relevance_max']:.3f}"])
    if table:
        doc.table(["type", "confidence", "relevance share"], table)
    skipped = (meta.get("syntactic") or {}).get("skipped")
    kinds = [[kind, "not measured" if kind == "syntactic" and skipped else str(summary[kind]["count"]),
              summary[kind]["heads"] or "-"]
             for kind in ("positional", "rare", "syntactic") if kind in summary]
    if kinds:
        doc.table(["function (enc-self)", "heads", "which"], kinds)
    if skipped:
        doc.paragraph(skipped)
    comparison = summary.get("importance_comparison")
    if comparison:
        doc.table(["type", "Spearman (relevance, I_h)", "p", "lowest quarter shared"],
                  [[t, f"{comparison[t]['spearman_r']:.2f}", f"{comparison[t]['spearman_p']:.2g}",
                    f"{comparison[t]['lowest_quarter_overlap']}/{comparison[t]['lowest_quarter']}"]
                   for t in ATTENTION_TYPES if t in comparison])
    for name in [f"heads_analysis-{t}.png" for t in ATTENTION_TYPES] + ["head_functions.png"]:
        path = files.figure(name)
        if os.path.exists(path):
            doc.image(path, name)
    _provenance(doc, part, state)


def shrink(doc: Document, files: Files, part, state) -> None:
    """Pruning to a budget without retraining (after Kwon et al. 2022): BLEU against heads removed per method."""
    doc.heading("Pruning without retraining (after Kwon et al. 2022)")
    rows = cl.read_rows(files.figure(sweep.SWEEP_LOG))
    if not rows or not any(r["key"] != "unpruned" for r in rows):
        _missing(doc, sweep.SWEEP_LOG, part.lines())
        return
    options = part.commands[0][1]
    calibration = next((r["calibration"] for r in rows if r.get("calibration")), {})
    heads_total = next(r["heads_total"] for r in rows if "heads_total" in r)
    doc.paragraph(
        "Heads removed to a budget with no gradient step on any weight, fitted on calibration sentences "
        f"(`{calibration.get('subset', options.calibration_subset)}`, {calibration.get('sentences', '?')} "
        f"sentences, targets: {calibration.get('targets', '?')}), BLEU on `{options.subset}`. Methods: `michel` "
        "masks the heads of lowest I_h (Michel et al., no tuning); `fisher` those of lowest empirical Fisher "
        "(Kwon's mask search); `+rearrange` swaps heads within layers (Kwon's mask rearrangement); `+scales` fits "
        "one least-squares scale per kept head (Kwon's mask tuning); `+out-proj` refits each pruned sublayer's "
        "out-projection by ridge least squares instead; `full+out-proj+ffn+min1` (the `shrink` command's default) "
        "removes heads greedily on the full empirical Fisher, keeping at least one head in every attention "
        "sublayer, and also refits every FFN's fc2. Every fit targets "
        "the unpruned model's residual stream, corrected for the drift the pruned layers below cause. The "
        "`shrink` command writes the chosen budget as a smaller stock checkpoint (same weights as the rows here).")
    path = files.figure(sweep.SWEEP_FIGURE)
    if os.path.exists(path):
        doc.image(path, "BLEU against heads removed without retraining; right: zoomed near the unpruned model")
    l0 = sweep.l0_rows(options.l0_compare, _header_of(files.figure(sweep.SWEEP_LOG))) if options.l0_compare else []
    tables = sweep.tables(rows, l0, heads_total)
    doc.table(*tables["curves"])
    if "candidates" in tables:
        doc.paragraph("Methods measured at fewer than three budgets:")
        doc.table(*tables["candidates"])
    if "l0" in tables:
        doc.paragraph("Voita et al.'s L0 gates at their numbers of heads (fine-tuned, so not like for like):")
        doc.table(*tables["l0"])
    elif options.l0_compare and os.path.exists(options.l0_compare):
        doc.paragraph(f"The L0 runs of `{options.l0_compare}` are not shown here: they were scored on another "
                      "checkpoint, data, subset or beam than these rows.")
    fallbacks = sum(len(r.get("fallbacks") or []) for r in rows)
    if fallbacks:
        doc.paragraph(f"{fallbacks} fits fell back to the original weights (ill-conditioned, exploding or no "
                      "gain; `fallbacks` in each row).")
    doc.paragraph("Speed: removing the same heads from the unpruned model is as fast as removing them from a "
                  "refit one (the fits change values, not shapes); `fairseq-headprune speed --heads SPEC` "
                  "measures it at equal work with a row's `removed_spec`.")
    _provenance(doc, part, state)


def deploy(doc: Document, files: Files, part, state) -> None:
    """Where the model is deployed: the unpruned model and its per-stack shrink in fairseq and CTranslate2."""
    doc.heading("Deployment: fairseq and CTranslate2")
    path = files.figure(study.FILES[0])
    if not os.path.exists(path):
        _missing(doc, study.FILES[0], part.lines())
        return
    with open(path, encoding="utf-8") as f:
        table = json.load(f)
    options = part.commands[0][1]
    doc.paragraph(
        f"The unpruned model and its shrink removing {options.shrink_percent:g}% of the heads in the {options.shape} "
        "shape (one head count per encoder and one per decoder: what CTranslate2 runs without padding; fitted on "
        f"the shrink part's calibration sentences, no retraining), exported to CTranslate2 (`export-ct2`'s spec) "
        "and timed beside fairseq. " + study.description(table["meta"]))
    doc.table(study.HEADERS, study.cells(table))
    figure = files.figure(study.FILES[2])
    if os.path.exists(figure):
        doc.image(figure, "Left: BLEU against sentences/s relative to the unpruned model in fairseq, the frontier "
                          "dashed. Right: the CTranslate2 int8 models at equal work over the unpruned int8, the "
                          "targets' quadrant shaded, ceilings dotted")
    doc.paragraph("Targets (a per-stack model in CTranslate2 int8 at least "
                  f"{study.SPEEDUP_TARGET}x the unpruned int8 at equal work, within {study.BLEU_TARGET} BLEU of the "
                  "unpruned fairseq model):")
    doc.bullets(study.target_lines(table["targets"]))
    if table.get("ceilings"):
        doc.paragraph(study.CEILINGS_TEXT)
        doc.table(study.CEILING_HEADERS, study.ceiling_cells(table["ceilings"]))
        doc.paragraph(study.ceiling_verdict(table["ceilings"]))
    _provenance(doc, part, state)


def recover(doc: Document, path: Optional[str], checkpoint_sha: str) -> None:
    """The recover study (shrink + a short distillation, against a control), an input of the report: it trains for
    minutes an epoch, so it is run apart (benchmarks/recover_study.py) and read here."""
    doc.heading("Recovering what pruning lost: `recover`")
    result = None
    if path:
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
    if not result or not result.get("rows"):
        doc.paragraph("No recover study for this model (option `--recover-study`): `recover` trains (minutes an "
                      "epoch on one CPU core), so its study runs apart and this section reads its table. For the "
                      "bundled De-En model: `recipes/recover_de_en.sh`, then `benchmarks/recover_study.py WORK OUT "
                      "--subset test`, whose `recover-test.json` is the input.")
        return
    sha = result.get("unpruned_sha256")
    whose = "" if sha == checkpoint_sha else (
        f" **Not this model's: the study's unpruned model is checkpoint {sha[:12]}.**" if sha else
        " **The file names no checkpoint: not known to be this model's.**")
    doc.paragraph(f"From `{path}` (a copy of `--recover-study`), BLEU on `{result['subset']}`: shrink alone, "
                  "shrink + `recover` (distillation from the unpruned model on fairseq's training loop) after each "
                  "epoch, and the control (the unpruned model put through the same recovery), whose change is "
                  f"subtracted in the last column. Significance: {result['settings']}.{whose}")
    doc.table(recover_table.HEADERS, recover_table.cells(result))
    figure = result.get("figure") and os.path.join(os.path.dirname(path), result["figure"])
    if figure and os.path.exists(figure):
        doc.image(figure, "BLEU against heads removed: shrink alone, recovered, the controls, L0 and from scratch")
    doc.paragraph("Targets, each recovery judged by the model it delivers (the epoch of lowest valid "
                  "loss), never by its best epoch on this set:")
    doc.bullets(recover_table.target_lines(recover_table.targets(result)))


def compress(doc: Document, out: str, path: Optional[str], checkpoint_sha: str) -> None:
    """The models `compress` built from this model: the speed/BLEU frontier they reached (studies.frontier), an input
    of the report (each run trains for an hour or more, so it runs apart and is read here)."""
    doc.heading("Compressing for deployment: `compress`")
    if not path:
        doc.paragraph("No compress runs for this model (option `--compress-runs DIR`, a folder of `compress --out` "
                      "folders): `compress` trains (an epoch is minutes on one CPU core), so its runs are made "
                      "apart and this section reads their records. For the bundled De-En model: "
                      "`recipes/compress_de_en.sh WORK \"--speedup 1.5\"`, one folder per target.")
        return
    with open(path, encoding="utf-8") as f:
        runs = json.load(f)
    found, sets = runs["rows"], frontier.reported_sets(runs["rows"])
    foreign = sorted({r["teacher_sha256"] or "unknown" for r in found} - {checkpoint_sha})
    whose = "" if not foreign else (
        f" **Not all of them this model's: compressed from checkpoint(s) {', '.join(s[:12] for s in foreign)}.**")
    doc.paragraph(f"{len(found)} runs of `compress` in `{runs['folder']}` (read from `{path}`). {frontier.TEXT} "
                  f"{frontier.significance(found)}{whose}")
    doc.table(frontier.headers(sets), frontier.cells(found, sets))
    if runs["controls"]:
        doc.paragraph("The control (the unpruned model through the same recovery, scored in the same engine): "
                      + "; ".join(f"{name}: " + ", ".join(f"{s} {d:+.2f}" for s, d in deltas.items())
                                  for name, deltas in runs["controls"].items()) + ".")
    figure = plots.compress_frontier(found, sets, runs["controls"], os.path.join(out, "report-compress-frontier.png"))
    doc.image(figure, "ΔBLEU against speed at equal work, one panel per reported set. " + frontier.LEGEND)


def commands(doc: Document, parts: Dict, state, report_line: str) -> None:
    doc.heading("Commands")
    doc.paragraph("Each part alone, a finished one as it ran (each resumes from its own result files and refuses "
                  "files of another run):")
    doc.code("\n".join(f"# {p.title}\n" + "\n".join(state.commands(p)) for p in parts.values()))
    doc.paragraph("This report (reuses what is done, resumes what is not):")
    doc.code(report_line)
