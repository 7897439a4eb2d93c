"""`fairseq-headprune shrink`: prune to a budget without retraining (Kwon et al. 2022) into a smaller stock checkpoint.

  fairseq-headprune shrink DATA --path CKPT --remove 50% --out OUT.pt [--results-dir DIR]
  fairseq-headprune shrink DATA --path CKPT --heads @closed-heads.json --out OUT.pt   (a selection made elsewhere)
  fairseq-headprune shrink DATA --path CKPT --sweep 10,20,...,80 --gen-subset test --references REF --results-dir DIR

The first form writes OUT.pt (physically pruned, loads with `fairseq-generate --user-dir fairseq_headprune`) and
OUT.json (kept heads, scales, budget, calibration provenance, the checkpoint's sha256; in --results-dir when
given) as one pair: written once, atomically, under a lock on OUT (fairseq_headprune.checkpoint_io). The second runs the
study over budgets (fairseq_headprune.studies.shrink_sweep) and writes shrink-sweep.jsonl, .md and .png.
"""
from __future__ import annotations

import glob
import os
import time

from fairseq_headprune.checkpoint_io import check_pair_paths, record_path_for
from fairseq_headprune.cli.common import output_checkpoint, results_folder
from fairseq_headprune.errors import UserError
from fairseq_headprune.compress.shrink import ShrinkOptions, parse_types, validate
from fairseq_headprune.studies.shrink_sweep import DEFAULT_METHODS


def add_args(parser) -> None:
    g = parser.add_argument_group("shrink")
    budget = g.add_mutually_exclusive_group()
    budget.add_argument("--remove", help="heads to remove: a number (72) or a share of the allowed heads (50%%)")
    budget.add_argument("--keep", help="heads to keep: a number or a share of the allowed heads")
    budget.add_argument("--flops", help="the pruned model's decoding FLOPs at most this share of the unpruned's (60%%)")
    budget.add_argument("--heads", metavar="SPEC", help="no search: remove and reconstruct these heads "
                        "(TYPE:LAYER:HEADS,... or @file.json, e.g. an L0 run's closed heads from `gates`)")
    g.add_argument("--types", default="enc-self,enc-dec,dec-self", help="attention types that may lose heads")
    g.add_argument("--keep-layers", metavar="dec:N[,enc:M]",
                   help="keep N decoder (M encoder) layers whole, the others removed (alone or with a head budget, "
                        "counted in the kept layers); every sublayer above the first removed one is reconstructed "
                        "towards the unpruned model's residual stream")
    g.add_argument("--layer-selection", default="importance", choices=("importance", "even"),
                   help="which layers --keep-layers keeps: greedy removal of the layer whose loss increase on the "
                        "calibration data is smallest (default), or Shleifer & Rush's evenly spaced layers")
    g.add_argument("--calibration-subset", default="valid")
    g.add_argument("--calibration-sentences", type=int, default=1000)
    g.add_argument("--calibration-targets", default="references", choices=("references", "self"),
                   help="teacher-force the references, or the unpruned model's own translations (no references)")
    g.add_argument("--calibration-beam", type=int, default=1, help="beam for --calibration-targets self")
    g.add_argument("--search", default="full", choices=("full", "block", "fisher", "importance"),
                   help="head selection: a greedy fill on the full or block-diagonal empirical Fisher (default full), "
                        "Kwon's diagonal Fisher score, or Michel's I_h")
    g.add_argument("--search-steps", type=int, default=1,
                   help="remove the budget in N steps, reconstructing and re-scoring the heads between steps")
    g.add_argument("--no-rearrange", action="store_true",
                   help="skip Kwon's in-layer mask rearrangement (after --search fisher or block)")
    g.add_argument("--shape", default="free", choices=("free", "per-stack"),
                   help="free: any number of heads per layer (default); per-stack: every encoder layer keeps the same "
                        "number, every decoder self- and cross-attention layer another (the shape CTranslate2 runs "
                        "faster: one head count per stack)")
    g.add_argument("--min-heads-per-layer", type=int, default=1, metavar="N",
                   help="every attention sublayer keeps at least N heads (default 1: none is emptied; 0: no limit)")
    g.add_argument("--refit", default="out-proj", choices=("none", "scales", "out-proj"),
                   help="reconstruction: none, one scale per kept head (Kwon), or a ridge refit of out_proj")
    g.add_argument("--ridge", type=float, default=1e-3, help="ridge of the out_proj refit (x mean diagonal)")
    g.add_argument("--max-scale", type=float, default=10.0, help="numerical guard of the fits (see NOTES)")
    g.add_argument("--refit-unpruned", action="store_true", help="also refit sublayers that lost no head")
    g.add_argument("--no-refit-ffn", action="store_true",
                   help="leave the FFNs alone (by default every fc2 is refit towards the same drift-corrected targets)")
    g.add_argument("--refit-inputs", action="store_true",
                   help="also map every drifted sublayer input back onto the unpruned model's, folded into q/k/v "
                        "and fc1 (beyond Kwon; see NOTES)")
    g.add_argument("--window-steps", type=int, default=0, metavar="N",
                   help="after each closed-form refit, fit each refit attention sublayer whole, with its softmax "
                        "(q/k/v, out_proj), by N Adam steps of at most 1000 calibration tokens each (0: none; "
                        "1000 steps took De-En's test2016 BLEU at 50%% removed from -1.21 to -0.92: see README)")
    g.add_argument("--window-lr", type=float, default=3e-4,
                   help="Adam's learning rate of --window-steps (chosen on val: see README)")
    g.add_argument("--no-empty-bias", action="store_true", help="leave the bias of emptied sublayers as it is")
    g.add_argument("--teacher-mildness", type=float, default=0.0,
                   help="reconstruct towards a teacher with this share of the removed heads masked (0: unpruned)")
    g.add_argument("--no-check", action="store_true", help="skip decoding the calibration slice with both models")
    g.add_argument("--check-sentences", type=int, help="calibration sentences decoded by the check (default all)")
    g.add_argument("--out", metavar="OUT.pt", help="the pruned checkpoint to write")
    g.add_argument("--recover-epochs", type=int, default=0, metavar="N",
                   help="then recover the pruned model for N epochs of DATA's train subset by distillation from "
                        "--path (fairseq_headprune recover's defaults): OUT.pt is the recovered model, the shrunk "
                        "one is kept as OUT.shrunk.pt; for other training options run `recover` itself")
    g.add_argument("--results-dir", help="folder for the JSON record (default: next to --out) or the sweep")
    g.add_argument("--sweep", metavar="PERCENTS",
                   help="run the study over budgets instead, e.g. 10,20,30,40,50,60,70,80")
    g.add_argument("--sweep-methods", default=",".join(DEFAULT_METHODS), help="methods of the sweep")
    g.add_argument("--sweep-tag", default="", help="a name for this calibration variant in the sweep's rows")
    g.add_argument("--references", help="raw references of --gen-subset for the sweep's BLEU")
    g.add_argument("--l0-compare", help="compare.jsonl of the L0 runs to show beside the sweep")


def options_from(args) -> ShrinkOptions:
    return ShrinkOptions(
        remove=args.remove, keep=args.keep, flops=args.flops, types=parse_types(args.types),
        calibration_subset=args.calibration_subset, calibration_sentences=args.calibration_sentences,
        calibration_targets=args.calibration_targets, calibration_beam=args.calibration_beam, search=args.search,
        search_steps=args.search_steps, min_heads=args.min_heads_per_layer, rearrange=not args.no_rearrange,
        refit=args.refit, ridge=args.ridge,
        max_scale=args.max_scale, refit_unpruned=args.refit_unpruned, empty_bias=not args.no_empty_bias,
        refit_ffn=not args.no_refit_ffn, refit_inputs=args.refit_inputs, teacher_mildness=args.teacher_mildness,
        check=not args.no_check,
        check_sentences=args.check_sentences, shape=args.shape, window_steps=args.window_steps,
        window_lr=args.window_lr, heads=args.heads, keep_layers=args.keep_layers,
        layer_selection=args.layer_selection)


def run(cfg, args) -> None:
    from fairseq_headprune.loading import load

    if args.sweep:
        return _run_sweep(cfg, args)
    if not args.out:
        raise UserError("--out OUT.pt is required (or --sweep for the study over budgets)")
    options = options_from(args)
    output_checkpoint("--out", args.out, cfg.common_eval.path or "")
    if args.recover_epochs < 0:
        raise UserError(f"--recover-epochs must be at least 0, not {args.recover_epochs}")
    final_out = args.out
    if args.recover_epochs:  # shrink writes its model beside the final one; recover then writes --out
        from fairseq_headprune.compress.recover import RecoverOptions

        recover_options = RecoverOptions(teacher=cfg.common_eval.path, out=final_out, epochs=args.recover_epochs,
                                         train_args=["-s", cfg.task.source_lang, "-t", cfg.task.target_lang]
                                         if cfg.task.get("source_lang") else [])
        args.out = os.path.splitext(final_out)[0] + ".shrunk.pt"
        for subset in ("train", "valid"):  # recover needs both; say so before minutes of shrinking
            if not glob.glob(os.path.join(cfg.task.data.split(os.pathsep)[0], subset + ".*")):
                raise UserError(f"--recover-epochs trains on DATA's '{subset}' subset: none in {cfg.task.data}")
    json_path = record_path_for(args.out, args.results_dir)
    check_pair_paths("--out", args.out, json_path)  # `--out X.json` would have its record written over it
    start = time.perf_counter()
    loaded = load(cfg)
    validate(options, loaded.model)
    from fairseq_headprune.compress.shrink import export, shrink

    result, calibration = shrink(loaded, options)
    record = export(loaded, result, calibration, options, args.out, json_path)
    seconds = time.perf_counter() - start
    depth = f"layers kept: {record['layers']['kept']}; " if record.get("layers") else ""
    print(f"{depth}removed {len(result.selection.removed)} heads ({record['heads_kept']} of "
          f"{record['heads_total']} kept): "
          f"{record['params_before']:,} -> {record['params_after']:,} parameters; {seconds:.0f}s in all\n"
          f"wrote {args.out} (fairseq loads it with --user-dir fairseq_headprune)\nwrote {json_path}")
    if args.recover_epochs:
        from fairseq_headprune.compress.recover import recover, record_path

        recovered = recover(cfg.task.data, args.out, recover_options)
        print(f"recovered it for {args.recover_epochs} epochs ({recovered['updates']} updates, best valid loss at "
              f"{recovered['updates_at_best']})\nwrote {final_out}\nwrote {record_path(final_out)}")


def _run_sweep(cfg, args) -> None:
    from fairseq_headprune.loading import load
    from fairseq_headprune.studies import shrink_sweep as sweep

    if not args.results_dir:
        raise UserError("--sweep needs --results-dir")
    if args.heads:
        raise UserError("--sweep searches a selection for every budget; --heads gives one: leave one of the two out")
    methods = tuple(m.strip() for m in args.sweep_methods.split(",") if m.strip())
    options = sweep.SweepOptions(shrink=options_from(args), percents=sweep.parse_percents(args.sweep), methods=methods,
                                 tag=args.sweep_tag)
    for m in methods:
        sweep.method_options(m, options.shrink)  # unknown methods fail here, before loading anything
    with results_folder(args.results_dir):
        outputs = sweep.run(load(cfg), options, args.results_dir, cfg.dataset.gen_subset, args.references,
                            args.l0_compare)
    for out in outputs:
        print(f"wrote {out}")
