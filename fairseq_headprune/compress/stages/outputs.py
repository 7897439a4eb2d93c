"""The outputs, each written whole: OUT/model.pt, OUT/ct2/ (with its card), OUT/MODEL_CARD.md and OUT/compress.json
last (the outputs are a set only while it is there); the verdict (met or missed, by how much) they carry."""
from __future__ import annotations

import os
import resource
import shutil
import tempfile
from dataclasses import asdict
from typing import Callable, Dict, List

from fairseq_headprune.compress import input_model, model_card, preflight
from fairseq_headprune.prune import levers
from fairseq_headprune.core.shape import shape_words
from fairseq_headprune.engines.timing import interval_words, target_verdict
from fairseq_headprune.compress.options import STAGES
from fairseq_headprune.compress.stages.results import Exported
from fairseq_headprune.records.log import atomic_output, write_json_atomic


def write(loaded, options, results: Dict[str, Dict], points: List[Dict], rates: Dict, plan: Dict,
          exported: Exported, shipped: str, log: Callable) -> Dict:
    """compress.json's record (`results`: each stage's record; estimates, verdict; paths made portable) and the
    files beside it: the model that ships (`shipped`) as OUT/model.pt, with the dictionaries of a trimmed
    vocabulary (--keep-vocab) beside it, and the CTranslate2 folder `exported` holds."""
    o = options
    record = {"target": o.target, "engine": o.engine, "options": {k: (list(v) if isinstance(v, tuple) else v)
                                                                    for k, v in asdict(o).items()},
              "source_checkpoint": os.path.abspath(loaded.checkpoint),
              "data": os.path.abspath(loaded.cfg.task.data),
              "stages": {name: results[name] for name in STAGES if name in results},
              "reachable_shapes": points, "rates": rates, "estimated_cpu_seconds": plan,
              "cpu_seconds": {name: results[name].get("cpu_seconds") for name in STAGES
                              if name in results},
              "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
              "teacher_trained_on": list(o.teacher_trained_on),
              "input_model": input_model.describe(loaded.checkpoint, loaded.saved_cfg.model, loaded.model)}
    record["verdict"] = verdict(record)
    preflight.output_folder(o.out)  # a file of the user's put there while the run went on stays untouched
    # paths as OUT/..., DATA/... or file names: the record and the card travel without this machine's folders
    record = model_card.portable(record, os.path.abspath(o.out), os.path.abspath(loaded.cfg.task.data))
    record_path = os.path.join(o.out, "compress.json")
    if os.path.exists(record_path):  # the outputs are a set only while compress.json is there: written last
        os.remove(record_path)
    for name in os.listdir(o.out):  # a vocabulary an earlier run trimmed goes with its model
        if preflight.OWN_VOCABULARY.fullmatch(name):
            os.remove(os.path.join(o.out, name))
    copies = {os.path.join(o.out, os.path.basename(path)): path for path in exported.dictionaries or []}
    for target, path in {os.path.join(o.out, "model.pt"): shipped, **copies}.items():
        shutil.copyfile(path, target + ".tmp")
        os.replace(target + ".tmp", target)
    card = model_card.render(record)
    if exported.ct2:
        replace_folder(exported.ct2, os.path.join(o.out, "ct2"))
        with atomic_output(os.path.join(o.out, "ct2", "MODEL_CARD.md")) as f:  # the card travels with ct2/
            f.write(card)
    with atomic_output(os.path.join(o.out, "MODEL_CARD.md")) as f:
        f.write(card)
    write_json_atomic(record_path, record)
    for line in record["verdict"]["lines"]:
        log(line)
    return record


def replace_folder(source: str, out: str) -> None:
    """A copy of `source` put in place of `out` whole (the old one moved aside first, removed once the new is in)."""
    staged = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(out)), prefix=".ct2-")
    os.rmdir(staged)
    shutil.copytree(source, staged)
    old = None
    if os.path.exists(out):
        old = staged + ".old"
        os.rename(out, old)
    os.rename(staged, out)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def chrf_words(scored: Dict) -> str:
    """"; chrF 59.50 against 60.00 (-0.50, p 0.040)" for a set the report stage scored with chrF too."""
    if "chrf_p" not in scored:
        return ""
    return (f"; chrF {scored['chrf_compressed']:.2f} against {scored['chrf_unpruned']:.2f} "
            f"({scored['chrf_delta']:+.2f}, p {scored['chrf_p']:.3f})")


def verdict(record: Dict) -> Dict:
    """Met or missed, by how much, and what the cost table says would reach a missed target."""
    stages = record["stages"]
    measured, reported, table = stages["measure"], stages["report"], stages["cost-table"]
    chosen = stages["choice"]["chosen"]
    speed, loss = measured["speedup_equal_work"], -reported["bleu_delta"]
    interval = measured.get("speedup_equal_work_interval")
    lines = [f"compressed model: {shape_words(chosen)}, {interval_words(interval) if interval else f'{speed:.2f}x'} "
             "the unpruned model "
             f"in {record['engine']} at equal work ({measured['speedup_as_decoded']:.2f}x as decoded; FLOP ratio "
             f"{measured['flop_ratio']:.2f}); BLEU on {reported['subset']} {reported['bleu_compressed']:.2f} against "
             f"{reported['bleu_unpruned']:.2f} ({reported['bleu_delta']:+.2f}, p {reported['p']:.3f})"
             + chrf_words(reported)]
    trained = set(record.get("teacher_trained_on") or ())
    for also in reported.get("also") or []:
        where = ("the unpruned model's training data: not a held-out result" if also["subset"] in trained else
                 "no choice or training of this run read it")
        lines.append(f"BLEU on {also['subset']} ({where}): "
                     f"{also['bleu_compressed']:.2f} against {also['bleu_unpruned']:.2f} ({also['bleu_delta']:+.2f}, "
                     f"p {also['p']:.3f})" + chrf_words(also))
    out = {"speedup": speed, "bleu_loss": round(loss, 2)}
    target = record["options"]["speedup"]
    if target is not None:
        said = target_verdict(interval, target) if interval else "met" if speed >= target else "missed"
        met = said != "missed"
        out["met"], out["speed_verdict"] = met, said
        bleu = (f"; BLEU {reported['bleu_delta']:+.2f} on {reported['subset']} (p {reported['p']:.3f}; "
                f"{'significant' if reported['p'] < 0.05 else 'not significant'} at 0.05; no BLEU bound was set)")
        if met:
            lines.append(f"target {target:g}x: speed {said} "
                         f"({interval_words(interval) if interval else f'{speed:.2f}x'}){bleu}")
        else:
            faster = [p for p in record["reachable_shapes"] if p["predicted_speedup"] > chosen["predicted_speedup"]]
            hint = (f"; the cost table predicts {shape_words(faster[-1])} at {faster[-1]['predicted_speedup']:.2f}x"
                    if faster else "")
            rerun = "" if record["options"].get("shape") else "; rerun with a higher --speedup to take it"
            lines.append(f"target {target:g}x: speed missed by {target - speed:.2f}x (predicted "
                         f"{chosen['predicted_speedup']:.2f}x{hint if rerun else ''}{rerun}){bleu}")
    else:
        (_, metric, bound), held = model_card.quality_target(record["options"]), reported["heldout"]
        said = model_card.held_verdict(held, bound)
        out["met"], out["quality_verdict"] = said == "met", said
        lines.append(f"target {metric} loss at most {bound:g} on held-out data: {said} "
                     f"({held['loss']:.2f} on valid's held-out split after recovery"
                     f"{model_card.held_interval_words(held)}, {held['loss_before_recovery']:.2f} before; "
                     f"{loss:.2f} on {reported['subset']})")
    out["lines"] = [line.replace("unpruned", "input") for line in lines] if record.get("input_model") else lines
    out["lever_order"] = levers.lever_order(table)
    return out

