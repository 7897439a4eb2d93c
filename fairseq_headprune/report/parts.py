"""What a report runs: its options (ReportOptions) and its parts, each a study with the command line that runs or
resumes it on its own and the identity a finished part is recognised by.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from fairseq_headprune.errors import UserError
from fairseq_headprune.options import option
from fairseq_headprune.core.heads import ATTENTION_TYPES
from fairseq_headprune.decoding.mask_batching import masks_per_batch_option
from fairseq_headprune.records import layout as names
from fairseq_headprune.records.log import write_json_atomic
from fairseq_headprune.studies import ablation, analysis, deploy, pruning, scoring, shrink_sweep, speed
from fairseq_headprune.studies.ranking import heads_to_json, importance_scores, rank_by_scores
from fairseq_headprune.decoding.workers import workers_option


PARTS = ("score", "single", "keep-one", "prune", "prune-types", "speed", "analyze", "shrink", "deploy")


@dataclass
class ReportOptions:
    """What the report runs and how; field names are the command's options."""

    subset: str = field(metadata={"flag": "--gen-subset"})
    parts: str = option(",".join(PARTS), flag="--parts",
                        help=f"parts to run, comma-separated, from {', '.join(PARTS)}")
    references: Optional[str] = option(None, flag="--references",
                                       help="raw reference file of --gen-subset (default: its decoded targets)")
    importance_subset: Optional[str] = option(None, flag="--importance-subset",
                                              help="subset I_h is computed on (default: --gen-subset)")
    masks_per_batch: Union[int, str] = masks_per_batch_option()  # ablate's and prune's, as those commands take it
    workers: Union[int, str] = workers_option()
    keep_one_select: str = option("bleu", flag="--keep-one-select", choices=("bleu", "loss"),
                                  help="keep-one: choose each layer's head by BLEU on --gen-subset (every head "
                                       "decoded), or by teacher-forced NLL on --importance-subset (or --gen-subset) "
                                       "and decode only the chosen heads on --gen-subset (BLEU, significance): one "
                                       "decode per layer instead of one per head")
    bootstrap_sample_ratio: float = option(0.5, flag="--bootstrap-sample-ratio",
                                           help="single, keep-one: size of each bootstrap resample as a share of the "
                                                "set (compare-mt's 0.5, so the verdicts compare with Michel et al.'s; "
                                                "`ablate` defaults to 1)")
    prune_orders: str = option("importance,oracle,random", flag="--prune-orders",
                               help="prune: orders of the whole-model curves")
    prune_step: float = option(0.1, flag="--prune-step", help="prune: share of heads masked at each step")
    speed_percent: float = option(50.0, flag="--speed-percent",
                                  help="speed: prune the heads the importance order prunes at this percent")
    speed_batch_sizes: str = option("1,4,16,64", flag="--speed-batch-sizes", help="speed: batch sizes timed")
    speed_runs: int = option(3, flag="--speed-runs", help="speed: interleaved timing rounds")
    speed_sentences: int = option(128, flag="--speed-sentences", help="speed: sentences timed")
    analyze_sentences: Optional[int] = option(None, flag="--analyze-sentences",
                                              help="analyze: only the first N sentences (default: all)")
    shrink_percents: str = option(",".join(f"{p:g}" for p in shrink_sweep.DEFAULT_PERCENTS), flag="--shrink-percents",
                                  help="shrink: shares of the heads removed without retraining, one budget each")
    shrink_methods: str = option(",".join(shrink_sweep.DEFAULT_METHODS), flag="--shrink-methods",
                                 help="shrink: the methods compared at every budget (see `fairseq-headprune shrink "
                                      "--help`)")
    shrink_calibration_subset: str = option("valid", flag="--shrink-calibration-subset",
                                            help="shrink: subset of DATA the pruning is fitted on (another than "
                                                 "--gen-subset, which scores it)")
    shrink_calibration_sentences: int = option(1000, flag="--shrink-calibration-sentences",
                                               help="shrink: calibration sentences (the first N of that subset)")
    deploy_percent: float = option(50.0, flag="--deploy-percent",
                                   help="deploy: the share of heads its per-stack shrink removes (fitted on the "
                                        "shrink part's calibration sentences), timed beside the unpruned model in "
                                        "fairseq and CTranslate2")
    deploy_runs: int = option(3, flag="--deploy-runs", help="deploy: interleaved timing rounds")
    deploy_batch1_sentences: int = option(100, flag="--deploy-batch1-sentences",
                                          help="deploy: sentences timed one at a time (latency)")
    dynamics: Optional[str] = option(None, flag="--dynamics",
                                     help="dynamics.jsonl of `dynamics` for claim C5: this model's training run "
                                          "(default: the bundled model's run for the bundled model, none for any "
                                          "other; a file of another model is judged and the report says whose it is)")
    l0_sweep: Optional[str] = option(None, flag="--l0-sweep", metavar="FILE",
                                     help="result file of Voita's L0 λ sweep (`compare`) for the Voita claim")
    l0_encoder_sweep: Optional[str] = option(None, flag="--l0-encoder-sweep", metavar="FILE",
                                             help="the same with encoder self-attention gated alone (Voita's main "
                                                  "experiment): when given, the Voita claim's verdict is this sweep's")
    recover_study: Optional[str] = option(None, flag="--recover-study", metavar="FILE",
                                          help="recover-test.json of benchmarks/recover_study.py, shown as the "
                                               "report's recover section (default: the bundled model's study, for "
                                               "the bundled model only)")
    compress_runs: Optional[str] = option(None, flag="--compress-runs", metavar="DIR",
                                          help="a folder of `compress --out` folders (DIR/*/compress.json), shown as "
                                               "the report's compress section: the speed/BLEU frontier they reached "
                                               "(default: the bundled model's, for the bundled model only)")
    note: str = option("", flag="--note", help="a sentence for the report's header (e.g. how the data was sliced)")
    render_only: bool = option(False, flag="--render-only",
                               help="run nothing: write the report from the result files already in --results-dir")

    def part_names(self) -> List[str]:
        parts = [p.strip() for p in self.parts.split(",") if p.strip()]
        bad = [p for p in parts if p not in PARTS]
        if bad or not parts:
            raise UserError(f"--parts: unknown part {bad[0] if bad else self.parts!r} (use {', '.join(PARTS)})")
        return parts


def options_argv(options: Any) -> List[str]:
    """A study's options as its command's own options: every field that differs from its default (and the fields
    marked `always`, such as ablate's --mode), as `--field-name value` (or the field's own flag), so the line
    reproduces the options when pasted."""
    out: List[str] = []
    for f in dataclasses.fields(options):
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        if flag == "--gen-subset":
            continue  # a fairseq option: set in the base line
        value = getattr(options, f.name)
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        if value is None or (value == default and not f.metadata.get("always")):
            continue
        if isinstance(value, bool):
            out.append(flag)  # a flag given means the non-default value (negated flags included)
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out


def set_option(argv: Sequence[str], name: str, value: Optional[str] = None) -> List[str]:
    """argv with `name` given once, set to `value` (a flag when value is None): replaced in place if present."""
    out, i, placed = [], 0, False
    argv = list(argv)
    while i < len(argv):
        token = argv[i]
        if token == name or token.startswith(name + "="):
            if not placed:
                out += [name] + ([value] if value is not None else [])
                placed = True
            i += 1 + (value is not None and "=" not in token)
            continue
        out.append(token)
        i += 1
    if not placed:
        out += [name] + ([value] if value is not None else [])
    return out


def command_line(command: str, options: Any, base: Sequence[str], out: str) -> str:
    """`fairseq-headprune COMMAND` with the user's fairseq options (the study's subset as --gen-subset), the
    results folder and the study's own options."""
    argv = set_option(set_option(base, "--results-dir", out), "--gen-subset", options.subset)
    return shlex.join(["fairseq-headprune", command, *argv, *options_argv(options)])


# change how fast a part runs, not what it computes: the studies write them as a run's note, not its identity
RUN_ONLY_OPTIONS = ("--workers", "--masks-per-batch")


def command_identity(line: str) -> str:
    """A command line without its run-only options: a part finished with one worker is finished for two."""
    words, kept, skip = shlex.split(line), [], False
    for word in words:
        if skip:
            skip = False
        elif word in RUN_ONLY_OPTIONS:
            skip = True
        elif not word.startswith(tuple(o + "=" for o in RUN_ONLY_OPTIONS)):
            kept.append(word)
    return shlex.join(kept)


@dataclass
class Part:
    """One section of the study: the studies that produce its files, with their options."""

    name: str
    title: str
    commands: List[Tuple[str, Any]] = field(default_factory=list)  # (command, study options)
    subsets: List[str] = field(default_factory=list)  # subsets it reads besides --gen-subset and I_h's
    rendered: List[str] = field(default_factory=list)

    def lines(self) -> List[str]:
        return list(self.rendered)


def plan(options: ReportOptions, base: Sequence[str], out: str) -> Dict[str, Part]:
    """Every part's study options, built from the report's options."""
    subset = options.subset
    importance = os.path.join(out, names.IMPORTANCE)
    single = os.path.join(out, names.ablation_name("single", "bleu") + ".jsonl")
    orders = [o.strip() for o in options.prune_orders.split(",") if o.strip()]
    sweep = dict(masks_per_batch=options.masks_per_batch, workers=options.workers,
                 bootstrap_sample_ratio=options.bootstrap_sample_ratio)
    prune = dict(step=options.prune_step, masks_per_batch=options.masks_per_batch, workers=options.workers,
                 references=options.references,
                 importance=importance)
    parts = {
        "score": Part("score", "Head importance", [
            ("score", scoring.ScoreOptions(subset=options.importance_subset or subset))]),
        "single": Part("single", "Single-head ablation", [
            ("ablate", ablation.AblationOptions(subset=subset, mode="single", references=options.references,
                                                **sweep))]),
        "keep-one": Part("keep-one", "Keep one head per layer", [("ablate", keep_one_options(options, sweep))]),
        "prune": Part("prune", "Pruning curves", [
            ("prune", pruning.PruneOptions(subset=subset, order=",".join(orders),
                                           ablation=single if "oracle" in orders else None, **prune))]),
        "prune-types": Part("prune-types", "Pruning each attention type alone", [
            ("prune", pruning.PruneOptions(subset=subset, order="importance", types=t, **prune))
            for t in ATTENTION_TYPES]),
        "speed": Part("speed", "Speed", [
            ("speed", speed.SpeedOptions(subset=subset, heads="@" + heads_file(out, options.speed_percent),
                                         batch_sizes=options.speed_batch_sizes, runs=options.speed_runs,
                                         num_sentences=options.speed_sentences))]),
        "analyze": Part("analyze", "Head analysis", [
            ("analyze", analysis.AnalyzeOptions(subset=subset, importance=importance,
                                                num_sentences=options.analyze_sentences))]),
        "shrink": Part("shrink", "Pruning without retraining", [
            ("shrink", shrink_sweep.SweepStudyOptions(
                subset=subset, sweep=options.shrink_percents, sweep_methods=options.shrink_methods,
                calibration_subset=options.shrink_calibration_subset,
                calibration_sentences=options.shrink_calibration_sentences, references=options.references,
                l0_compare=options.l0_sweep))], subsets=[options.shrink_calibration_subset]),
        "deploy": Part("deploy", "Deployment: fairseq and CTranslate2", [
            ("deploy", deploy.DeployOptions(
                subset=subset, references=options.references, shrink_percent=options.deploy_percent,
                calibration_subset=options.shrink_calibration_subset,
                calibration_sentences=options.shrink_calibration_sentences, runs=options.deploy_runs,
                batch1_sentences=options.deploy_batch1_sentences))], subsets=[options.shrink_calibration_subset]),
    }
    for part in parts.values():
        part.rendered = [command_line(command, opts, base, out) for command, opts in part.commands]
    return parts


def keep_one_options(options: ReportOptions, sweep: Dict) -> ablation.AblationOptions:
    """`ablate --mode keep-one`: BLEU of every head on the subset, or (--keep-one-select loss) each layer's head
    chosen by NLL on the importance subset and only those decoded on the subset, BLEU and significance."""
    subset = options.subset
    if options.keep_one_select == "bleu":
        return ablation.AblationOptions(subset=subset, mode="keep-one", references=options.references, **sweep)
    return ablation.AblationOptions(subset=subset, mode="keep-one", metric="loss",
                                    select_subset=options.importance_subset or subset, report_subset=subset,
                                    report_metric="bleu", report_references=options.references, **sweep)


def heads_file(out: str, percent: float) -> str:
    return os.path.join(out, names.speed_heads_name(percent))


def write_speed_heads(out: str, percent: float, layout, checkpoint_sha: str) -> str:
    """The heads the whole-model importance order prunes at `percent` (what `prune` masks there), as a head file.

    Written by the report itself, so that the speed part does not depend on the prune part having run."""
    importance = os.path.join(out, names.IMPORTANCE)
    if not os.path.exists(importance):
        raise UserError(f"speed needs {importance} (the score part) to choose the heads to prune: add score to --parts")
    candidates = layout.all_heads()
    ranking = rank_by_scores(importance_scores(importance, checkpoint_sha), candidates)
    path = heads_file(out, percent)
    write_json_atomic(path, heads_to_json(ranking[: int(round(percent / 100 * len(candidates)))]))
    return path
