"""OUT/MODEL_CARD.md of a `compress` run: what was removed, how fast the model runs and how well it translates against
the unpruned model in the same engine, the data every choice was made on, and the commands that reproduce it. Pure
text from compress.json's record (compress.pipeline)."""
from __future__ import annotations

import shlex
from typing import Dict, List, Optional

from fairseq_headprune.compress import levers


def render(record: Dict) -> str:
    st, o = record["stages"], record["options"]
    choice, shrunk, recovered = st["choice"], st["shrink"], st["recover"]
    measured, reported, table = st["measure"], st["report"], st["cost-table"]
    chosen = choice["chosen"]
    whole = table["whole"]
    lines: List[str] = [
        "# Model card: a compressed translation model", "",
        f"Made by `fairseq-headprune compress` from `{record['source_checkpoint']}` for {record['engine']} "
        f"({record['target']}).", "",
        "## Result", "",
        *[f"- {line}" for line in record["verdict"]["lines"]], "",
        "| | unpruned | compressed |", "|---|---|---|",
        f"| heads per layer, encoder / decoder | {whole['enc_heads']} / {whole['dec_heads']} | "
        f"{chosen['enc_heads']} / {chosen['dec_heads']} |",
        f"| encoder layers | {encoder_depth(choice)} | {chosen['enc_layers']} |" if "enc_layers" in chosen else None,
        f"| decoder layers | {whole['dec_layers']} | {chosen['dec_layers']} |" if "dec_layers" in chosen else None,
        f"| FFN units kept | 100% | {chosen['ffn_percent']:g}% |" if "ffn_percent" in chosen else None,
        f"| heads in all | {shrunk['heads_total']} | {shrunk['heads_kept']} |",
        f"| parameters | {shrunk['params_before']:,} | {shrunk['params_after']:,} |",
        f"| BLEU, {reported['subset']} ({reported['sentences']} sentences, {reported['engine']}) | "
        f"{reported['bleu_unpruned']:.2f} | {reported['bleu_compressed']:.2f} (p {reported['p']:.3f}) |",
        *[f"| BLEU, {a['subset']} ({a['sentences']} sentences, {reported['engine']}) | {a['bleu_unpruned']:.2f} | "
          f"{a['bleu_compressed']:.2f} (p {a['p']:.3f}) |" for a in reported.get("also") or []],
        f"| speed at equal work ({measured['subset']}, {measured['sentences']} sentences) | 1.00x | "
        f"{measured['speedup_equal_work']:.2f}x |",
        f"| speed as decoded | 1.00x ({measured['sentences_per_s']['unpruned']:.1f} sentences/s) | "
        f"{measured['speedup_as_decoded']:.2f}x ({measured['sentences_per_s']['compressed']:.1f} sentences/s) |",
        f"| decoding FLOPs, unpruned over this model's | 1.00 | {measured['flop_ratio']:.2f} |", "",
        f"Speed: one thread, {measured['runs']} rounds interleaved batch by batch with the unpruned model in the same "
        "engine, the median of the per-batch ratios (the ratio of total seconds at equal work: "
        f"{measured.get('speedup_equal_work_total', float('nan')):.2f}x); "
        f"*equal work*: every hypothesis forced to {measured['forced_length']} tokens + 1 step (the unpruned "
        f"model's mean); *as decoded*: each model's own translations. BLEU: sacreBLEU ({reported['signature']}) "
        f"against {reported['references']}; {reported['significance']}. The machine's load moves sentences/s; the "
        "ratios much less" + load_words(measured, chosen) + ".", "",
        "## What was removed", "",
        removed_line(chosen, {**whole, "enc_layers": encoder_depth(choice)} if "enc_layers" in chosen else whole),
        "",
        "## How each choice was made, and on which data", "",
        f"- The shape: {choice['chosen_by']}. Predicted {chosen['predicted_speedup']:.2f}x by the cost table below"
        + (f", {chosen['measured_speedup']:.2f}x when its slice was timed again." if "measured_speedup" in chosen
           else "."),
        f"- The heads: per-sentence mask gradients on {choice['calibration']['sentences']} sentences of "
        f"'{choice['calibration']['subset']}' (ids hash {choice['calibration']['ids_sha256']}), each layer's heads in "
        "the greedy order of its Fisher block.",
        f"- The reconstruction: {shrunk['calibration']['sentences']} sentences of "
        f"'{shrunk['calibration']['subset']}', out_proj and FFN ridge refits, then a window fit of each pruned "
        f"attention sublayer ({o['window_steps']} Adam steps, lr {o['window_lr']:g}).",
        layers_line(choice),
        recover_line(recovered),
        f"- Speed: sentences of '{measured['subset']}'. The reported set '{reported['subset']}' was decoded once, "
        "after every choice, by both models" + also_line(reported) + ".", "",
        "## Cost table", "",
        f"Each lever alone, cut crudely from the unpruned model and timed in {record['engine']} at equal work "
        f"({table['sentences']} sentences of '{o['timing_subset']}' in {table['identity']['batches']} batches, "
        f"{table['identity']['runs']} rounds). A row's saving counts "
        "only when its slice was faster in significantly more batches than not (sign test, p < 0.05), made "
        "monotone over the values; a shape that moves several levers is predicted by multiplying the shares of "
        "time each leaves. *Not yet* removable: measured so "
        "that a missed target says what they would buy.", "",
        levers.markdown(table), "",
        *cost_lines(record),
        "## Reproduce", "",
        "```", record_command(record), "```", "",
        "The run is staged in OUT/stages/ (each stage cached by its identity): the same command resumes an "
        "interrupted run, and a larger --budget-epochs extends the recovery. The pruned fairseq checkpoint "
        "(model.pt) loads with `fairseq-generate --user-dir fairseq_headprune`; ct2/ with "
        "`ctranslate2.Translator`.", "",
    ]
    return "\n".join(line for line in lines if line is not None)


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


def also_line(reported: Dict) -> str:
    """The --also-report sets, and how many of their source sentences a choice or training read anyway."""
    parts = []
    for a in reported.get("also") or []:
        seen = ", ".join(f"{n} in '{name}'" for name, n in a["overlap"].items() if n)
        parts.append(f"'{a['subset']}' ({a['references']}; source sentences also found elsewhere: {seen or 'none'})")
    return "; so were " + ", ".join(parts) if parts else ""


def removed_line(chosen: Dict, whole: Dict) -> str:
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
    return (f"{depth}Every encoder layer keeps {chosen['enc_heads']} of {whole['enc_heads']} heads and every "
            f"{'kept ' if depth else ''}decoder self- and cross-attention layer {chosen['dec_heads']} of "
            f"{whole['dec_heads']} {heads}. " + (
                f"Every FFN keeps {chosen['ffn_percent']:g}% of its hidden units (the highest by their mask Fisher "
                "score on the calibration sentences, `shrink --ffn-keep`); the embeddings and output layer are whole."
                if "ffn_percent" in chosen else "The FFNs, embeddings and output layer are whole."))


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
              "none": "the references alone (no distillation)"}[recovered.get("distill") or "logits"]
    if recovered.get("elsewhere"):
        return (f"- The recovery: {what_ran(recovered)}, run elsewhere ({recovered['elsewhere']}, a student of this "
                "run's shrink), from the fairseq-train command `--stop-after shrink` printed.")
    budget = f"budget {recovered['budget_epochs']} epochs" + (f" or {recovered['budget_updates']} updates"
                                                               if recovered.get("budget_updates") else "")
    return (f"- The recovery: {what_ran(recovered)}: fairseq-train on 'train', {signal}{term}, early stopping "
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
    return (f"recovery: {recovered['updates']} updates on {recovered['sentences']} sentences{drawn}, {processes} "
            f"process{'es' if processes != 1 else ''} on {device}")


def record_command(record: Dict) -> str:
    command = record["options"].get("command") or ""
    return command if command else "fairseq-headprune compress " + shlex.join([record["data"]])


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
