"""`fairseq-headprune shrink`: prune to a budget without retraining (Kwon et al. 2022) into a smaller stock checkpoint.

  fairseq-headprune shrink DATA --path CKPT --remove 50% --out OUT.pt [--results-dir DIR]
  fairseq-headprune shrink DATA --path CKPT --heads @closed-heads.json --out OUT.pt   (a selection made elsewhere)
  fairseq-headprune shrink DATA --path CKPT --sweep 10,20,...,80 --gen-subset test --references REF --results-dir DIR
  fairseq-headprune shrink DATA --path CKPT --keep-vocab CORPUS.SRC CORPUS.TGT [--keep-vocab-floor N] --out DIR/OUT.pt

The options of the pruning itself are declared on prune.shrink_options.ShrinkOptions (with its nested reconstruction and
window-fit options) and parsed from there; this module adds only what the command does with the result.

The first form writes OUT.pt (physically pruned, loads with `fairseq-generate --user-dir fairseq_headprune`) and
OUT.json (kept heads, scales, budget, calibration provenance, the checkpoint's sha256; in --results-dir when
given) as one pair: written once, atomically, under a lock on OUT (fairseq_io.checkpoint_io). The second runs the
study over budgets (fairseq_headprune.studies.shrink_sweep) and writes shrink-sweep.jsonl, .md and .png. The
last trims the vocabulary to what a deployment needs (prune.vocabulary; alone, or with any budget of the first):
DIR also receives the trimmed dictionaries (dict.LANG.txt, langs.txt), written with the pair; alone, OUT.pt keeps
its source's architecture, so stock fairseq loads it with DIR as its dictionaries' folder.
"""
from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass
from typing import Optional

from fairseq_headprune.fairseq_io.checkpoint_io import check_pair_paths, record_path_for
from fairseq_headprune.cli.common import output_checkpoint, results_folder
from fairseq_headprune.errors import UserError
from fairseq_headprune.prune.shrink import shrink, trim_only, write_checkpoint
from fairseq_headprune.prune.shrink_options import (ShrinkOptions, flat_fields, inert_options, parse_ffn_keep,
                                                    vocabulary_only)
from fairseq_headprune.prune.vocab_trim import plan_for
from fairseq_headprune.prune.vocabulary import read_corpora, refuse_foreign_dictionaries
from fairseq_headprune.options import add_arguments, from_arguments, option
from fairseq_headprune.studies.shrink_sweep import DEFAULT_METHODS
from fairseq_headprune.cli.recover import summary
from fairseq_headprune.prune.recover import record_path, recover, refuse_output_of_another_run, reusable_student
from fairseq_headprune.prune.recovery_config import RecoverOptions
from fairseq_headprune.fairseq_io.loading import load
from fairseq_headprune.studies import shrink_sweep as sweep


@dataclass
class ShrinkCommand:
    """What the command does with the pruned model (the pruning's own options: ShrinkOptions)."""

    out: Optional[str] = option(None, flag="--out", metavar="OUT.pt", help="the pruned checkpoint to write")
    recover_epochs: int = option(0, flag="--recover-epochs", metavar="N",
                                 help="then recover the pruned model for N epochs of DATA's train subset by "
                                      "distillation from --path (fairseq_headprune recover's defaults): OUT.pt is the "
                                      "recovered model, the shrunk one is kept as OUT.shrunk.pt; for other training "
                                      "options run `recover` itself")
    results_dir: Optional[str] = option(None, flag="--results-dir", metavar="DIR",
                                        help="folder for the JSON record (default: next to --out) or the sweep")
    sweep: Optional[str] = option(None, flag="--sweep", metavar="PERCENTS",
                                  help="run the study over budgets instead, e.g. 10,20,30,40,50,60,70,80")
    sweep_methods: str = option(",".join(DEFAULT_METHODS), flag="--sweep-methods", help="methods of the sweep")
    sweep_tag: str = option("", flag="--sweep-tag", help="a name for this calibration variant in the sweep's rows")
    references: Optional[str] = option(None, flag="--references",
                                       help="raw references of --gen-subset for the sweep's BLEU")
    l0_compare: Optional[str] = option(None, flag="--l0-compare",
                                       help="compare.jsonl of the L0 runs to show beside the sweep")


def add_args(parser) -> None:
    g = parser.add_argument_group("shrink")
    add_arguments(g, ShrinkOptions)  # the options of the pruning itself, declared on ShrinkOptions
    add_arguments(g, ShrinkCommand)


def shrink_options(args) -> ShrinkOptions:
    options = from_arguments(ShrinkOptions, args)
    inert = inert_options(options)
    if inert:
        raise UserError(inert)
    return options


def run(cfg, args) -> None:
    c = from_arguments(ShrinkCommand, args)
    if c.sweep:
        if getattr(args, "keep_vocab", None):
            raise UserError("--keep-vocab trims one model's vocabulary: the sweep compares head selections over "
                            "budgets (shrink one model with --out)")
        if getattr(args, "ffn_keep", None) is not None and parse_ffn_keep(args.ffn_keep) != 100:
            raise UserError("--ffn-keep narrows one model's FFNs: the sweep compares head selections over budgets "
                            "(shrink one model with --out)")
        return _run_sweep(cfg, args, c)
    if not c.out:
        raise UserError("--out OUT.pt is required (or --sweep for the study over budgets)")
    options = shrink_options(args)
    output_checkpoint("--out", c.out, cfg.common_eval.path or "")
    if c.recover_epochs < 0:
        raise UserError(f"--recover-epochs must be at least 0, not {c.recover_epochs}")
    if c.recover_epochs and options.vocabulary.corpora:
        raise UserError("--recover-epochs trains on DATA, binarised with the untrimmed dictionaries: shrink with "
                        "--keep-vocab after recovering, or use compress --keep-vocab (the trim after its recovery)")
    final_out = c.out
    if c.recover_epochs:  # shrink writes its model beside the final one; recover then writes --out

        langs = [getattr(cfg.task, "source_lang", None), getattr(cfg.task, "target_lang", None)]
        recover_options = RecoverOptions(teacher=cfg.common_eval.path, out=final_out, epochs=c.recover_epochs,
                                         train_args=["-s", langs[0], "-t", langs[1]] if all(langs) else [],
                                         command="shrink")
        c.out = os.path.splitext(final_out)[0] + ".shrunk.pt"
        for subset in ("train", "valid"):  # recover needs both; say so before minutes of shrinking
            if not glob.glob(os.path.join(cfg.task.data.split(os.pathsep)[0], subset + ".*")):
                raise UserError(f"--recover-epochs trains on DATA's '{subset}' subset: none in {cfg.task.data}")
    json_path = record_path_for(c.out, c.results_dir)
    check_pair_paths("--out", c.out, json_path)  # `--out X.json` would have its record written over it
    corpora = read_corpora(options.vocabulary)  # missing, empty or not UTF-8: refused before loading
    if corpora:
        refuse_foreign_dictionaries(c.out, json_path)
    start = time.perf_counter()
    if vocabulary_only(options):
        return _trim_vocabulary(cfg, options, corpora, c.out, json_path, start)
    if c.recover_epochs and _reusable(cfg, options, c.out, json_path, recover_options):  # a rerun resumes
        print(f"reusing {c.out}: shrunk by an earlier run with these options (its recovery resumes)")
    else:
        loaded = load(cfg)
        plan = plan_for(loaded, corpora, options.vocabulary.floor) if corpora else None
        result, calibration = shrink(loaded, options)
        record = write_checkpoint(loaded, result, calibration, options, c.out, json_path, plan=plan)
        seconds = time.perf_counter() - start
        depth = f"layers kept: {record['layers']['kept']}; " if record.get("layers") else ""
        print(f"{depth}removed {len(result.selection.removed)} heads ({record['heads_kept']} of "
              f"{record['heads_total']} kept): {record['params_before']:,} -> {record['params_after']:,} parameters; "
              f"{seconds:.0f}s in all\n"
              f"wrote {c.out}" + (f" and {', '.join(sorted(plan.files))} beside it (its vocabulary)" if plan else "")
              + f" (fairseq loads it with --user-dir fairseq_headprune)\nwrote {json_path}")
    if c.recover_epochs:
        recovered = recover(cfg.task.data, c.out, recover_options)
        print(f"{summary(recovered, c.out, time.perf_counter() - start)}\nwrote {final_out}\n"
              f"wrote {record_path(final_out)}")


def _trim_vocabulary(cfg, options: ShrinkOptions, corpora, out: str, json_path: str, start: float) -> None:
    """--keep-vocab alone: no calibration, no search; the model with fewer vocabulary rows and its dictionaries."""
    loaded = load(cfg)
    plan = plan_for(loaded, corpora, options.vocabulary.floor)
    trim_only(loaded, options, plan, out, json_path)
    folder = os.path.dirname(os.path.abspath(out))
    print(f"{time.perf_counter() - start:.0f}s in all\nwrote {out} and {', '.join(sorted(plan.files))} beside it "
          f"(stock fairseq loads it with {folder} as DATA, or DATA binarised against those dictionaries)\n"
          f"wrote {json_path}")


def _reusable(cfg, options, shrunk: str, json_path: str, recover_options) -> bool:
    """Whether OUT.shrunk.pt is what this shrink would write again (prune.recover.reusable_student); an OUT
    another run wrote is refused first, before minutes of shrinking."""
    import json

    refuse_output_of_another_run(recover_options, shrunk)

    recorded = json.loads(json.dumps(flat_fields(options)))  # as write_checkpoint records them (tuples as lists)
    return reusable_student(shrunk, json_path, cfg.common_eval.path, cfg.task.data, recorded)


def _run_sweep(cfg, args, c: ShrinkCommand) -> None:
    if not c.results_dir:
        raise UserError("--sweep needs --results-dir")
    if args.heads:
        raise UserError("--sweep searches a selection for every budget; --heads gives one: leave one of the two out")
    methods = tuple(m.strip() for m in c.sweep_methods.split(",") if m.strip())
    options = sweep.SweepOptions(shrink=shrink_options(args), percents=sweep.parse_percents(c.sweep),
                                 methods=methods, tag=c.sweep_tag)
    for m in methods:
        sweep.method_options(m, options.shrink)  # unknown methods fail here, before loading anything
    with results_folder(c.results_dir):
        outputs = sweep.run(load(cfg), options, c.results_dir, cfg.dataset.gen_subset, c.references,
                            c.l0_compare)
    for out in outputs:
        print(f"wrote {out}")
