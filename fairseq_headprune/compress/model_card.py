"""OUT/MODEL_CARD.md of a `compress` run, written for the person who deploys the model: first a plain summary (what
was removed, speed and latency at batch 1 against the unpruned model in the same engine, BLEU on each held-out set,
the verdict on the target), then the data every choice was made on and the command that reproduces it. Pure text
from compress.json's record (compress.pipeline), whose paths are made portable here (OUT/..., DATA/..., names)."""
from __future__ import annotations

import os
import shlex
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

from fairseq_headprune.prune import levers
from fairseq_headprune.core.shape import shape_words
from fairseq_headprune.engines.timing import interval_words, target_verdict
from fairseq_headprune.prune.recovery_config import DEFAULT_DISTILL
from fairseq_headprune.prune.vocab_trim import changes_words, ct2_sizes


USE_FAIRSEQ = ("`model.pt` is the pruned fairseq checkpoint: it loads with `fairseq-generate --user-dir "
               "fairseq_headprune`.")
GLOSSARY = ("*Equal work*: both models forced to write the same number of tokens for every sentence, so that the "
            "ratio is the model's speed alone, not a shorter output. *As decoded*: each model's own translations. "
            "*p*: the chance of a BLEU (or chrF) drop at least this large if the compressed model were as good "
            "(paired bootstrap); below 0.05 the drop is significant. *95% interval*: where the difference would fall "
            "on 95% of redraws of the set; a set too small for the loss you care about gives a wide one, and 'not "
            "significant' then means inconclusive, not 'no loss'. *FLOP ratio*: the unpruned model's arithmetic over "
            "this model's. *Cost table*: what removing each part alone buys, timed on this machine. *Fisher "
            "estimate*: the loss increase a removal is predicted to cause, from squared gradients. *Calibration "
            "sentences*: training sentences the choices are made on; *NLL*: the loss on them.")


def render(record: Dict) -> str:
    """The card: a summary for the person who deploys the model first, then how it was made and measured."""
    lines = (summary_lines(record) + result_lines(record) + method_lines(record) + cost_table_lines(record)
             + use_lines(record))
    card = "\n".join(line for line in lines if line is not None)
    return against_input(card, record) if record.get("input_model") else card


def against_input(card: str, record: Dict) -> str:
    """The card of a model compressed from a pruned one: "the input model" (with its shape) wherever the card says
    "unpruned", and the model it was made from, with the command that measures against that one."""
    described = record["input_model"]
    source = described.get("made_from")
    origin = (f" It was made from `{source}` (as the record beside it names it): every figure here is against the "
              f"input model; to measure this model against that one, run `fairseq-headprune deploy DATA --path "
              f"{source} --results-dir DIR --shrink-percent 0 --compare compressed=model.pt --candidate compressed`."
              if source else
              " No record beside it names the model it was made from: every figure here is against the input model.")
    note = f"The input model is itself pruned ({described['shape']}).{origin}"
    title, _, rest = card.partition("\n\n")
    made, _, rest = rest.partition("\n\n")
    return "\n\n".join((title, made, note, rest.replace("unpruned", "input")))


class Facts(NamedTuple):
    """What the card's sections read from a record, named once."""

    stages: Dict
    choice: Dict
    shrunk: Dict
    measured: Dict
    reported: Dict
    chosen: Dict
    whole: Dict  # the unpruned model's heads per stack and depth (the cost table's)
    trained: Set[str]  # --teacher-trained-on: reported sets the unpruned model was trained on
    engine: str


def facts(record: Dict) -> Facts:
    st = record["stages"]
    return Facts(st, st["choice"], st["shrink"], st["measure"], st["report"], st["choice"]["chosen"],
                 st["cost-table"]["whole"], set(record.get("teacher_trained_on") or ()), record["engine"])


def summary_lines(record: Dict) -> List[Optional[str]]:
    """The title and the summary for the person who deploys the model."""
    st, choice, shrunk, measured, reported, chosen, whole, trained, engine = facts(record)
    return [
        "# Model card: a compressed translation model", "",
        f"Made by `fairseq-headprune compress` from {source_name(record)} for {engine} ({record['target']}).", "",
        "## Summary", "",
        f"- **Removed**: {summary_removed(chosen, whole, shrunk)}",
        f"- **Speed** against the unpruned model in {engine}, {threads_words(measured)}, at equal work: "
        f"{speed_words(measured)} {batch_words(measured)}; " + latency_words(measured),
        deployment_words(measured),
        f"- **BLEU** ({engine}, sacreBLEU): " + "; ".join(bleu_words(r) for r in held_out(reported, trained)),
        *(["- **On the unpruned model's own training data** (not a held-out result: the unpruned model has seen "
           "these sentences, so its score there is inflated): "
           + "; ".join(bleu_words(r) for r in all_sets(reported) if r["subset"] in trained)] if trained else []),
        *([vocab_map_words(st["export"]["check"]["vocab_map"])]
          if (st.get("export") or {}).get("check", {}).get("vocab_map") else []),
        f"- **Target** {target_words(record, trained)}", "",
        GLOSSARY, "",
    ]


def result_lines(record: Dict) -> List[Optional[str]]:
    """The result table (unpruned against compressed), how it was measured, and what was removed."""
    st, choice, shrunk, measured, reported, chosen, whole, trained, engine = facts(record)
    vocabulary = st["export"].get("vocabulary")
    return [
        "## Result", "",
        "| | unpruned | compressed |", "|---|---|---|",
        f"| heads per layer, encoder / decoder | {whole['enc_heads']} / {whole['dec_heads']} | "
        f"{chosen['enc_heads']} / {chosen['dec_heads']} |",
        f"| encoder layers | {encoder_depth(choice)} | {chosen['enc_layers']} |" if "enc_layers" in chosen else None,
        f"| decoder layers | {whole['dec_layers']} | {chosen['dec_layers']} |" if "dec_layers" in chosen else None,
        f"| FFN units kept | 100% | {chosen['ffn_percent']:g}% |" if "ffn_percent" in chosen else None,
        f"| heads in all | {shrunk['heads_total']} | {shrunk['heads_kept']} |",
        vocabulary_row(vocabulary),
        f"| parameters | {shrunk['params_before']:,} | "
        f"{(vocabulary['memory']['parameters_after'] if vocabulary else shrunk['params_after']):,} |",
        *[f"| BLEU, {set_name(a, trained)} ({a['sentences']} sentences, {engine}) | {a['bleu_unpruned']:.2f} | "
          f"{a['bleu_compressed']:.2f} (p {a['p']:.3f}) |" for a in all_sets(reported)],
        *[f"| chrF, {set_name(a, trained)} | {a['chrf_unpruned']:.2f} | {a['chrf_compressed']:.2f} "
          f"(p {a['chrf_p']:.3f}) |" for a in all_sets(reported) if "chrf_p" in a],
        f"| speed at equal work ({measured['subset']}, {measured['sentences']} sentences) | 1.00x | "
        f"{speed_words(measured)} |",
        f"| speed as decoded | 1.00x ({measured['sentences_per_s']['unpruned']:.1f} sentences/s) | "
        f"{measured['speedup_as_decoded']:.2f}x ({measured['sentences_per_s']['compressed']:.1f} sentences/s) |",
        latency_row(measured),
        f"| decoding FLOPs, unpruned over this model's | 1.00 | {measured['flop_ratio']:.2f} |", "",
        f"Speed: {threads_words(measured)}, {measured['runs']} rounds interleaved batch by batch with the unpruned "
        "model in the same engine, the median of the per-batch ratios (the ratio of total seconds at equal work: "
        f"{measured.get('speedup_equal_work_total', float('nan')):.2f}x); equal work forces every hypothesis to "
        f"{measured['forced_length']} tokens + 1 step (the unpruned model's mean). BLEU: sacreBLEU "
        f"({reported['signature']}) against {reported['references']}; {reported['significance']}"
        + (f"; chrF: sacreBLEU ({reported['chrf_signature']}), its p on the same resamples"
           if "chrf_signature" in reported else "") + ". The machine's "
        "load moves sentences/s; the ratios much less" + load_words(measured, chosen) + ".", "",
        "## What was removed", "",
        removed_line(chosen, {**whole, "enc_layers": encoder_depth(choice)} if "enc_layers" in chosen else whole,
                     trimmed=bool(vocabulary)),
        "", vocabulary_line(vocabulary, record["options"]), "" if vocabulary else None,
    ]


def vocabulary_row(vocabulary: Optional[Dict]) -> Optional[str]:
    """The result table's row of a vocabulary --keep-vocab trimmed (None without one)."""
    if not vocabulary:
        return None
    source, target = vocabulary["source"], vocabulary["target"]
    if vocabulary["one_dictionary"]:
        return f"| vocabulary (one table for both sides) | {source['before']:,} | {source['after']:,} |"
    return (f"| vocabulary, source / target | {source['before']:,} / {target['before']:,} | {source['after']:,} / "
            f"{target['after']:,} |")


def vocabulary_line(vocabulary: Optional[Dict], options: Dict) -> Optional[str]:
    """What the trim kept, checked and saved (None without --keep-vocab)."""
    if not vocabulary:
        return None
    corpora = ", ".join(f"`{c['name']}`" if "name" in c else f"`{os.path.basename(c['path'])}`"
                        for c in vocabulary["corpora"])
    floor = options.get("vocabulary", {}).get("floor")
    check, memory = vocabulary.get("check"), vocabulary["memory"]
    checked = (f" The kept tokens' logits equal the recovered model's on {check['sentences_checked']} of "
               f"{check['sentences']} check sentences (those using kept tokens only; largest difference "
               f"{check['max_logit_diff']:.1e})." if check else "")
    sizes, size = ct2_sizes(memory), ""
    if sizes:
        before, after, what = sizes
        size = (f" Its weights take {after:.2f} MiB in a float32 CTranslate2 model" if what == "weights" else
                f" A float32 CTranslate2 model of it takes {after:.2f} MiB on disk")
        size += f" against {before:.2f} MiB untrimmed."
    changes = vocabulary.get("hypotheses")
    changed = (f" Of the first {changes['sentences']} sentences of '{changes['subset']}', decoded in fairseq by "
               f"both, {changes['changed']} hypotheses changed ({changes_words(changes)})." if changes else "")
    return (f"The vocabulary was trimmed after the recovery to what the deployment needs (`--keep-vocab`): the "
            f"special symbols, the language tokens of the pair and every token of {corpora}"
            + (f", then the most frequent others up to {floor} symbols" if floor else "") + "; a source word outside "
            "it reads as `<unk>`, and a hypothesis of the recovered model changes only where it held a dropped "
            f"word, or where near-equal beams reorder (the softmax over the kept words).{checked}{changed}{size} "
            "The dictionaries beside model.pt are the ones it was trimmed to.")


def method_lines(record: Dict) -> List[Optional[str]]:
    """How each choice was made, and on which data."""
    st, o = record["stages"], record["options"]
    choice, shrunk, recovered, measured, reported = (st["choice"], st["shrink"], st["recover"], st["measure"],
                                                     st["report"])
    window = o.get("window") or {"steps": o["window_steps"], "lr": o["window_lr"]}  # (records before it was nested)
    chosen = choice["chosen"]
    trained = set(record.get("teacher_trained_on") or ())
    return [
        "## How each choice was made, and on which data", "",
        f"- The shape: {plain(choice['chosen_by'])}. Predicted {chosen['predicted_speedup']:.2f}x by the cost table "
        "below"
        + (f", {timed_words(chosen)} when the unpruned model cut to it (without refitting) was timed "
           "again." if "measured_speedup" in chosen else "."),
        f"- Why it won: {choice['why']}" if choice.get("why") else None,
        f"- The heads: how much the loss rises when each head is masked, from per-sentence gradients on "
        f"{choice['calibration']['sentences']} sentences of '{choice['calibration']['subset']}' (the sentence ids' "
        f"SHA-256 begins {choice['calibration']['ids_sha256']}); in each layer, the heads whose removal together "
        "raises it least (Fisher information, taken greedily).",
        f"- The reconstruction: {shrunk['calibration']['sentences']} sentences of "
        f"'{shrunk['calibration']['subset']}', out_proj and FFN ridge refits, then a window fit of each pruned "
        f"attention sublayer ({window['steps']} Adam steps, lr {window['lr']:g}).",
        layers_line(choice),
        recover_line(recovered),
        f"- Speed: sentences of '{measured['subset']}'. The reported set '{reported['subset']}' was decoded once, "
        "after every choice, by both models" + also_line(reported, trained) + ".", "",
    ]


def cost_table_lines(record: Dict) -> List[Optional[str]]:
    """The cost table: what each part alone buys in the engine."""
    o, table, engine = record["options"], record["stages"]["cost-table"], record["engine"]
    return [
        "## Cost table", "",
        f"Each part alone, removed from the unpruned model without refitting (what any model of that shape costs) "
        f"and timed in {engine} at equal work ({table['sentences']} sentences of '{o['timing_subset']}' in "
        f"{table['identity']['batches']} batches, {table['identity']['runs']} rounds). A row's saving counts only "
        "when the cut model was faster in significantly more "
        "batches than not (sign test, p < 0.05), made monotone over the values; a shape that moves several parts is "
        "predicted by multiplying the shares of time each leaves. *Removable*: compress can take it from a trained "
        "model (the others are measured so that a missed target says what they would buy).", "",
        levers.markdown(current_levers(table)), "",
        *cost_lines(record),
    ]


def use_lines(record: Dict) -> List[Optional[str]]:
    """How to use the model, and the command that made it."""
    st = record["stages"]
    return [
        "## Use", "",
        "`ct2/` is a CTranslate2 model with its tokenizer's files: `fairseq-headprune translate ct2/ < raw.txt` "
        "translates raw text, and `ct2/README.md` shows the same with `ctranslate2` and the tokenizer's own "
        "library alone. " + USE_FAIRSEQ if (st["export"].get("check") or {}).get("deployable") else
        "`ct2/` is a plain CTranslate2 model (exported before the folder carried its tokenizer: it reads the "
        "tokens fairseq reads; `export-ct2` writes it again with them). " + USE_FAIRSEQ if st["export"].get("ct2")
        else USE_FAIRSEQ,
        "",
        "## Reproduce", "",
        "```", record_command(record), "```", "",
        "DATA is the data folder the run read, OUT the output folder (--out). The run is staged in OUT/stages/ (each "
        "stage cached by its identity): the same command resumes an interrupted run, and a larger --budget-epochs "
        "extends the recovery.", "",
    ]


def plain(text: str) -> str:
    """Recorded wording in the card's terms (records name a cut of the unpruned model a "crude slice")."""
    return text.replace("crude slice", "cut of the unpruned model (no refit)")


def source_name(record: Dict) -> str:
    """The unpruned checkpoint as the command named it (a relative path), with the start of its SHA-256."""
    sha = (record["stages"]["cost-table"].get("identity") or {}).get("model_sha256")
    given = _option_value(record["options"].get("command") or "", "--path")
    name = given if given and not os.path.isabs(given) else os.path.basename(record["source_checkpoint"])
    return f"`{name}` (SHA-256 `{sha[:16]}`)" if sha else f"`{name}`"


def _option_value(command: str, flag: str) -> Optional[str]:
    tokens = shlex.split(command)
    for i, token in enumerate(tokens[:-1]):
        if token == flag:
            return tokens[i + 1]
    return None


def vocab_map_words(vmap: Dict) -> str:
    """The summary's line for a model shipped with a vocabulary map (compress --vocab-map)."""
    line = (f"- **Vocabulary map** (`ct2/vmap.txt`, translated with `use_vmap=True`): the output layer scores only the "
            f"{vmap['always']} most frequent target tokens and the {vmap['per_source']} each source token of the batch "
            f"brings in (co-occurrence in {vmap['sentence_pairs']} training pairs); speed and BLEU above are with it")
    if "differing" in vmap:
        line += (f"; on the export check's {vmap['sentences']} sentences it changed {vmap['differing']} translations "
                 f"(BLEU {vmap['bleu_without']:.2f} without, {vmap['bleu_with']:.2f} with)")
    return line


def summary_removed(chosen: Dict, whole: Dict, shrunk: Dict) -> str:
    removed = 100 * (1 - shrunk["params_after"] / shrunk["params_before"])
    depth = f" and {whole['dec_layers']} decoder layers" if "dec_layers" in whole else ""
    return (f"{shape_words(chosen)}, from {whole['enc_heads']}/{whole['dec_heads']} heads per layer{depth}; "
            f"{shrunk['heads_total'] - shrunk['heads_kept']} of "
            f"{shrunk['heads_total']} heads, {removed:.0f}% of the parameters.")


def speed_words(measured: Dict, key: str = "speedup_equal_work") -> str:
    """The speed with its 95% interval and what it rests on (a record made before intervals: the median alone)."""
    interval = measured.get(f"{key}_interval")
    return interval_words(interval) if interval else f"{measured[key]:.2f}x"


def timed_words(point: Dict) -> str:
    """A choice point's timed speed, with its interval where the record has one."""
    interval = point.get("measured_interval")
    return interval_words(interval) if interval else f"{point['measured_speedup']:.2f}x"


def threads_words(measured: Dict) -> str:
    threads = (measured.get("deployment") or {}).get("threads", 1)
    return "one thread" if threads == 1 else f"{threads} threads"


def batch_words(measured: Dict) -> str:
    """The batches the target was timed at: the deployment's (--deploy-batch) or the timing's."""
    batch = (measured.get("deployment") or {}).get("batch")
    if batch == 1:
        return "as latency at batch 1, one sentence at a time (--deploy-batch 1)"
    if batch:
        return f"in batches of {batch} sentences (--deploy-batch {batch})"
    return f"in batches of up to {measured.get('largest_batch', '?')} sentences"


def deployment_words(measured: Dict) -> Optional[str]:
    """Where it was measured and what the served models hold (records made before it: nothing)."""
    where = measured.get("deployment")
    if not where:
        return None
    memory = where.get("memory")
    held = (f"; served, the CTranslate2 model holds {memory['compressed'] / 2**20:.0f} MiB resident against the "
            f"unpruned model's {memory['unpruned'] / 2**20:.0f} MiB" if memory else "")
    disk = (memory or {}).get("on_disk")
    held += (f" ({disk['compressed'] / 2**20:.1f} MiB on disk against {disk['unpruned'] / 2**20:.1f} MiB; the resident "
             "size holds CTranslate2's own allocations besides the weights)" if disk else "")
    engine = f"CTranslate2 {where['ctranslate2']}" if "ctranslate2" in where else f"torch {where['torch']}"
    return (f"- **Measured on** {where['cpu']} ({where['instruction_set']}), {engine}, "
            f"{threads_words(measured)}{held}.")


def latency_words(measured: Dict) -> str:
    if "batch64" in measured:  # served at batch 1: the other figure is batched
        other = measured["batch64"]
        return (f"at batches of {other['batch']} sentences {interval_words(other['interval'])}: "
                f"{other['ms']['compressed']:.1f} ms a batch against {other['ms']['unpruned']:.1f} ms.")
    lat = measured.get("latency_batch1")
    if not lat:
        return ("latency at batch 1 (one sentence at a time): not measured by this run (its record predates the "
                "measurement).")
    speed = interval_words(lat["interval"]) if lat.get("interval") else f"{lat['speedup']:.2f}x"
    return (f"latency at batch 1 (one sentence at a time) {speed}: {lat['ms']['compressed']:.1f} ms "
            f"a sentence against {lat['ms']['unpruned']:.1f} ms (median of {lat['sentences']} sentences).")


def latency_row(measured: Dict) -> str:
    if "batch64" in measured:
        other = measured["batch64"]
        return (f"| speed at batches of {other['batch']}, equal work ({other['sentences']} sentences) | 1.00x | "
                f"{other['speedup']:.2f}x |")
    lat = measured.get("latency_batch1")
    if not lat:
        return "| latency at batch 1, equal work | not measured | not measured |"
    return (f"| latency at batch 1, equal work ({lat['sentences']} sentences) | {lat['ms']['unpruned']:.1f} ms | "
            f"{lat['ms']['compressed']:.1f} ms ({lat['speedup']:.2f}x) |")


def all_sets(reported: Dict) -> List[Dict]:
    return [reported, *(reported.get("also") or [])]


def held_out(reported: Dict, trained: set) -> List[Dict]:
    return [r for r in all_sets(reported) if r["subset"] not in trained]


def set_name(r: Dict, trained: set) -> str:
    return f"{r['subset']} (the unpruned model's training data)" if r["subset"] in trained else r["subset"]


def bleu_words(r: Dict) -> str:
    """A set's BLEU against the unpruned model's, the difference with its 95% interval and p; chrF beside it (a
    record made before either: without it)."""
    interval = r.get("bleu_delta_interval")
    spread = f", 95% interval {interval[0]:+.2f} to {interval[1]:+.2f}" if interval else ""
    chrf = (f"; chrF {r['chrf_compressed']:.2f} against {r['chrf_unpruned']:.2f} ({r['chrf_delta']:+.2f}, "
            f"p {r['chrf_p']:.3f})" if "chrf_p" in r else "")
    return (f"{r['subset']} {r['bleu_compressed']:.2f} against {r['bleu_unpruned']:.2f} "
            f"({r['bleu_compressed'] - r['bleu_unpruned']:+.2f}{spread}, p {r['p']:.3f}){chrf}")


def target_words(record: Dict, trained: set) -> str:
    """The verdict on the target, speed and BLEU both."""
    o, st = record["options"], record["stages"]
    measured, reported = st["measure"], st["report"]
    speed = measured["speedup_equal_work"]
    sets = held_out(reported, trained)
    drops = [r for r in sets if r["bleu_compressed"] < r["bleu_unpruned"] and r["p"] < 0.05]
    bleu = (f"BLEU significantly lower (p < 0.05) on {', '.join(r['subset'] for r in drops)}" if drops else
            "BLEU not significantly lower on any held-out set (p >= 0.05)")
    if o.get("speedup") is not None:
        interval = measured.get("speedup_equal_work_interval")
        met = (target_verdict(interval, o["speedup"]) if interval else
               "met" if speed >= o["speedup"] else "missed")
        if met == "missed":
            met = f"missed by {o['speedup'] - speed:.2f}x"
        return f"--speedup {o['speedup']:g}: speed {met} ({speed_words(measured)}); {bleu} (no BLEU bound was set)."
    held, (flag, metric, bound) = reported["heldout"], quality_target(o)
    return (f"{flag} {bound:g}: {held_verdict(held, bound)} ({held['loss']:.2f} {metric} lost on valid's held-out "
            f"split after recovery{held_interval_words(held)}); {bleu}; speed {speed:.2f}x (no speed bound was set).")


def held_verdict(held: Dict, bound: float) -> str:
    """The quality target's verdict (report.quality_verdict: "met", "inconclusive" or "missed"); a record made
    before the held-out interval: met or missed by the loss alone."""
    return held.get("verdict") or ("met" if held["loss"] <= bound else "missed")


def held_interval_words(held: Dict) -> str:
    """"; the loss's 95% interval -0.40 to 0.83 over 500 sentences", where the record has one."""
    interval = held.get("delta_interval")
    if not interval:
        return ""
    a, b = held["sentences"]["heldout"]
    return f"; the loss's 95% interval {-interval[1]:.2f} to {-interval[0]:.2f} over {b - a} sentences"


def quality_target(options: Dict) -> Tuple[str, str, float]:
    """(flag, metric, bound) of a record's quality target: --max-bleu-loss, or --max-chrf-loss (records made
    before it hold no such field)."""
    if options.get("max_chrf_loss") is not None:
        return "--max-chrf-loss", "chrF", options["max_chrf_loss"]
    return "--max-bleu-loss", "BLEU", options["max_bleu_loss"]


def current_levers(table: Dict) -> Dict:
    """The cost table with each row's removability as compress has it now (a record made before a part became
    removable says so in its rows)."""
    now = {lever.field: lever.removable for lever in levers.LEVERS}
    return {**table, "rows": [{**r, "removable": now.get(r.get("field"), r["removable"])} for r in table["rows"]]}


def cost_lines(record: Dict) -> List[str]:
    """CPU minutes of each stage against the estimate printed first (records before these fields: nothing)."""
    spent, estimated = record.get("cpu_seconds"), record.get("estimated_cpu_seconds") or {}
    if not spent:
        return []
    return ["## Cost of the run", "",
            "CPU minutes of each stage as run (a stage resumed or extended counts its last call), against the "
            "estimate the run printed first, from rates measured before it started:", "",
            "| stage | CPU minutes | estimated |", "|---|---|---|",
            *[f"| {name} | {_minutes(spent.get(name))} | {_minutes(estimated.get(name))} |" for name in spent],
            "", f"Peak memory of the last call: {record.get('peak_rss_gib', float('nan')):.2f} GiB.", ""]


def _minutes(seconds) -> str:
    return "" if seconds is None else f"{seconds / 60:.1f}"


def also_line(reported: Dict, trained: set = frozenset()) -> str:
    """The --also-report sets, and how many of their source sentences a choice or training read anyway."""
    parts = []
    for a in reported.get("also") or []:
        seen = ", ".join(f"{n} in '{name}'" for name, n in a["overlap"].items() if n)
        teacher = "; the unpruned model was trained on it" if a["subset"] in trained else ""
        parts.append(f"'{a['subset']}' ({a['references']}; source sentences also found in this run's data: "
                     f"{seen or 'none'}{teacher})")
    return "; so were " + ", ".join(parts) if parts else ""


def removed_line(chosen: Dict, whole: Dict, trimmed: bool = False) -> str:
    """What the chosen shape removed: the decoder's layers (if any), then the heads of every layer kept."""
    depth = ""
    if "enc_layers" in chosen:
        depth = (f"The encoder keeps {chosen['enc_layers']} of its {whole['enc_layers']} layers (layers "
                 f"{', '.join(map(str, chosen['layers_kept']['enc']))}, renumbered 1..{chosen['enc_layers']}). ")
    if "dec_layers" in chosen:
        depth += (f"The decoder keeps {chosen['dec_layers']} of its {whole['dec_layers']} layers (layers "
                  f"{', '.join(map(str, chosen['layers_kept']['dec']))}, renumbered 1..{chosen['dec_layers']}). ")
    heads = (f"({chosen['heads_removed']} heads removed: `{chosen['heads']}`)" if chosen["heads_removed"] else
             "(no head removed)")
    rest = "keep the vocabulary below" if trimmed else "are whole"
    return (f"{depth}Every encoder layer keeps {chosen['enc_heads']} of {whole['enc_heads']} heads and every "
            f"{'kept ' if depth else ''}decoder self- and cross-attention layer {chosen['dec_heads']} of "
            f"{whole['dec_heads']} {heads}. " + (
                f"Every FFN keeps {chosen['ffn_percent']:g}% of its hidden units (the highest by their mask Fisher "
                f"score on the calibration sentences, `shrink --ffn-keep`); the embeddings and output layer {rest}."
                if "ffn_percent" in chosen else f"The FFNs are whole; the embeddings and output layer {rest}."
                if trimmed else "The FFNs, embeddings and output layer are whole."))


def layers_line(choice: Dict) -> Optional[str]:
    """How the layers were chosen, when the chosen shape cut a stack's depth."""
    if "dec_layers" not in choice["chosen"] and "enc_layers" not in choice["chosen"]:
        return None
    return ("- The layers: removed one at a time, each the layer whose removal left the lowest calibration loss on "
            "the same sentences (`shrink --keep-layers --layer-selection importance`); the heads, on the model "
            "without them.")


def recover_line(recovered: Dict) -> str:
    if not recovered.get("recovered"):
        return "- No recovery (--budget-epochs 0)."
    hidden = recovered.get("distill_hidden")
    term = (f" and a hidden-state term (β {hidden['weight']:g}; teacher decoder layers {hidden['teacher_layers']})"
            if hidden else "")
    signal = {"logits": "distillation from the unpruned model",  # records before --distill: logits
              "sequences": "the unpruned model's beam translations of it as targets (sequence-level distillation)",
              "both": "distillation from the unpruned model on its own beam translations of it (`--distill both`)",
              "none": "the references alone (no distillation)"}[recovered.get("distill") or DEFAULT_DISTILL]
    if recovered.get("elsewhere"):
        return (f"- The {what_ran(recovered)}, run elsewhere ({recovered['elsewhere']}, a student of this "
                "run's shrink), from the fairseq-train command `--stop-after shrink` printed.")
    budget = f"budget {recovered['budget_epochs']} epochs" + (f" or {recovered['budget_updates']} updates"
                                                               if recovered.get("budget_updates") else "")
    return (f"- The {what_ran(recovered)}: fairseq-train on 'train', {signal}{term}, early stopping "
            f"on 'valid' (best valid loss at {recovered['updates_at_best']} of {recovered['updates']} updates, "
            f"{budget}).")


def what_ran(recovered: Dict) -> str:
    """`recovery: N updates on M sentences, P process(es) on DEVICE` (records before it: the updates alone)."""
    if "processes" not in recovered:
        return f"recovery: {recovered['updates']} updates"
    processes = recovered["processes"]
    sample = recovered.get("sample") or {}
    drawn = f" (drawn at random from {sample['of']}, seed {sample['seed']})" if sample.get("sampled") else ""
    device = ("a device the checkpoint does not record" if recovered["device"] == "elsewhere"
              else recovered["device"])
    extra = recovered.get("distillation_set")
    beside = (f" and {extra['pairs']} pairs of the unpruned model's translations ({extra['nbest']} best each) of "
              f"{extra['sources']} --distill-source sentences" if extra else "")
    if extra and "share" in extra:  # (records before the mix was recorded: the pairs alone)
        beside += (f" (train's pairs counted {extra['upsample_primary']}x an epoch, --upsample-primary: the "
                   f"translations {100 * extra['share']:.0f}% of an epoch's pairs)")
    return (f"recovery: {recovered['updates']} updates on {recovered['sentences']} sentences{drawn}{beside}, "
            f"{processes} process{'es' if processes != 1 else ''} on {device}")


def record_command(record: Dict) -> str:
    command = record["options"].get("command") or ""
    return command if command else "fairseq-headprune compress " + shlex.join([record["data"]])


# --------------------------------------------------------------------------------------------- portable records


def portable_path(path: str, out: str, data: str) -> str:
    """An absolute path as the card and compress.json name it: OUT/... under --out, DATA/... under the data folder,
    the file's name otherwise (never this machine's folders)."""
    for root, name in ((out, "OUT"), (data, "DATA")):
        if root and (path == root or path.startswith(root.rstrip(os.sep) + os.sep)):
            rest = os.path.relpath(path, root)
            return name if rest == "." else f"{name}/{rest}"
    return os.path.basename(path.rstrip(os.sep)) or path


def _portable_text(text: str, out: str, data: str) -> str:
    """Each absolute path in a value (comma-separated lists and `--flag=path` included) made portable."""
    head, sep, tail = text.partition("=") if text.startswith("--") else ("", "", text)
    parts = [portable_path(p, out, data) if os.path.isabs(p) else p for p in tail.split(",")]
    return head + sep + ",".join(parts)


def portable(value, out: str, data: str):
    """The record with every absolute path made portable (portable_path); the command rewritten token by token."""
    if isinstance(value, dict):
        return {k: (portable_command(v, out, data) if k == "command" and isinstance(v, str) else
                    portable(v, out, data)) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v, out, data) for v in value]
    if isinstance(value, str) and os.sep in value:
        return _portable_text(value, out, data)
    return value


def portable_command(command: str, out: str, data: str) -> str:
    return shlex.join(_portable_text(token, out, data) for token in shlex.split(command)) if command else command


def load_words(measured: Dict, chosen: Dict) -> str:
    """The 1-minute load average while the model and its slice were timed, where recorded (records before it: none)."""
    parts = [f"{what} {value:.1f}" for what, value in (("this measurement", measured.get("load_average")),
                                                         ("the choice's timing", chosen.get("timing_load")))
             if value is not None]
    return f" (1-minute load average: {', '.join(parts)}; one timing alone reads about 1)" if parts else ""


def encoder_depth(choice: Dict) -> int:
    """The unpruned encoder's depth, from a choice that cut it: the layers kept and those its layer search removed."""
    return choice["chosen"]["enc_layers"] + sum(step["removed"].startswith("enc:")
                                                for step in choice["layer_order"]["steps"])
