"""The whole study of one model in one process (`fairseq-headprune report DATA --path CKPT --results-dir DIR`).

The model and task are loaded once; every part is a study called as a function on them (fairseq_headprune.studies):
`score` (I_h), `ablate --mode single` and `--mode keep-one`, `prune` (whole model by --prune-orders; each attention
type alone by importance), `speed` (the heads the importance order prunes at --speed-percent), `analyze`, and
`shrink` (retraining-free pruning to a budget, over budgets: studies.shrink_sweep).
Then it checks the papers' claims against the result files (report.claims) and writes DIR/report.md and
a self-contained DIR/report.html (figures embedded) with every table and figure, the sacreBLEU signatures and, for
each part, the command line that produces or resumes it on its own (rendered from the part's options);
DIR/claims.json holds the claim rows with the files they were computed from.

Reuse and resume: each study appends its results as it goes and resumes from its own files (refusing files of
another run identity). DIR/report-state.json records each finished part with its command lines, the checkpoint's
hash and the data's fingerprints: a finished part whose commands and inputs are unchanged is not run again. An
interrupted report therefore resumes inside the part it was in.
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from fairseq_headprune.report.document import Document, to_html, to_markdown
from fairseq_headprune.errors import UserError
from fairseq_headprune.core.heads import ATTENTION_TYPES, HeadLayout
from fairseq_headprune.decoding.mask_batching import parse_masks_per_batch
from fairseq_headprune.records import layout as names
from fairseq_headprune.records.identity import file_sha256, upgrade_fingerprints
from fairseq_headprune.records.log import atomic_output, read_json, write_json_atomic
from fairseq_headprune.studies import ablation, analysis, deploy, frontier, pruning, scoring, shrink_sweep, speed
from fairseq_headprune.studies.ranking import steps
from fairseq_headprune.decoding.workers import kept_pools, parse_workers
from fairseq_headprune.engines.ct2 import check_task, ct2_decoding
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.fairseq_io import loading
from fairseq_headprune.fairseq_io.loading import progress_for
from fairseq_headprune.report import sections
from fairseq_headprune.report.sections import checkpoints_named
from fairseq_headprune.report.parts import (Part, ReportOptions, command_identity, options_argv, plan, set_option,
                                            write_speed_heads)

STATE = names.REPORT_STATE
# the bundled De-En model's training run: C5's input by default for that model only (see default_dynamics)
BUNDLED_DYNAMICS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "results", "dynamics", "dynamics.jsonl")
# the compress runs of the bundled De-En model (recipes/compress_de_en.sh): shown by default for that model only
BUNDLED_COMPRESS_RUNS = os.path.normpath(os.path.join(os.path.dirname(BUNDLED_DYNAMICS), os.pardir,
                                                      "compress-de-en"))
# the recover study of the bundled De-En model (benchmarks/recover_study.py): shown by default for that model only
BUNDLED_RECOVER_STUDY = os.path.join(os.path.dirname(BUNDLED_DYNAMICS), os.pardir, "recover-de-en",
                                     "recover-test.json")


# ---------------------------------------------------------------- command lines


# ---------------------------------------------------------------- running the parts

def run_study(command: str, options: Any, loaded, out: str) -> None:
    """One part's study, in this process, on the report's loaded model."""
    cfg = loaded.cfg
    if command == "score":
        scoring.run(loaded, options, out, progress_for(cfg, f"score {options.subset}"))
    elif command == "ablate":
        ablation.run(loaded, options, out, progress=progress_for(cfg, f"ablate {options.mode}"))
    elif command == "prune":
        pruning.run(loaded, options, out)
    elif command == "speed":
        speed.run(loaded, options, out)
    elif command == "analyze":
        analysis.run(loaded, options, out, progress_for(cfg, f"analyze {options.subset}"))
    elif command == "shrink":
        shrink_sweep.run(loaded, options.sweep_options(), out, options.subset, options.references,
                         options.l0_compare)
    elif command == "deploy":
        deploy.run(loaded, options, out)
    else:
        raise ValueError(f"no study for command {command!r}")


class State:
    """DIR/report-state.json: the parts finished, with their command lines and the checkpoint they ran on."""

    def __init__(self, path: str, checkpoint_sha: str, data_fingerprints: Optional[Dict[str, str]] = None,
                 part_fingerprints: Optional[Dict[str, Dict[str, str]]] = None):
        self.path, self.checkpoint_sha = path, checkpoint_sha
        self.data_fingerprints = data_fingerprints or {}  # the subsets every part reads
        self.part_fingerprints = part_fingerprints or {}  # part -> the other subsets it reads (Part.subsets)
        self.data = read_json(path) or {"parts": {}}

    def fingerprints(self, part: Part) -> Dict[str, str]:
        return {**self.data_fingerprints, **self.part_fingerprints.get(part.name, {})}

    def finished(self, part: Part) -> bool:
        """Recorded as finished with the same command lines, on the same checkpoint and the same data (a data
        folder changed in place since makes the part run again, and its results files refuse the old rows)."""
        rec = self.data["parts"].get(part.name)
        recorded = upgrade_fingerprints({"data_fingerprints": rec.get("data_fingerprints")})["data_fingerprints"] \
            if rec else None
        return bool(self._same_run(part) and recorded == self.fingerprints(part))

    def _same_run(self, part: Part) -> bool:
        rec = self.data["parts"].get(part.name)
        return bool(rec and rec.get("finished") and rec.get("checkpoint_sha256") == self.checkpoint_sha
                    and [command_identity(c) for c in rec.get("commands", [])]
                    == [command_identity(c) for c in part.lines()])

    def commands(self, part: Part) -> List[str]:
        """The command lines that made the part's files as they ran (a report rendered with other run-only
        options still prints those); the part's own lines when it has not finished with them."""
        return list(self.data["parts"][part.name]["commands"]) if self._same_run(part) else part.lines()

    def record(self, part: Part, seconds: float) -> None:
        self.data["parts"][part.name] = {
            "commands": part.lines(), "checkpoint_sha256": self.checkpoint_sha,
            "data_fingerprints": self.fingerprints(part), "seconds": round(seconds, 1),
            "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        write_json_atomic(self.path, self.data)

    def seconds(self, name: str) -> Optional[float]:
        return self.data["parts"].get(name, {}).get("seconds")


def default_dynamics(checkpoint_sha: str) -> Optional[str]:
    """C5's input when --dynamics is not given: the bundled model's training run when the checkpoint is the model
    that run ended in (results/dynamics/.model-sha256) or one of its epochs; for any other checkpoint none (C5 is
    "not run"): the bundled model's dynamics are never judged as another model's."""
    if os.path.isfile(BUNDLED_DYNAMICS) and checkpoint_sha in checkpoints_named(BUNDLED_DYNAMICS):
        return BUNDLED_DYNAMICS
    return None


def default_recover_study(checkpoint_sha: str) -> Optional[str]:
    """The recover study's table when --recover-study is not given: the bundled model's, for that model only."""
    if os.path.isfile(BUNDLED_RECOVER_STUDY) and (read_json(BUNDLED_RECOVER_STUDY) or {}).get(
            "unpruned_sha256") == checkpoint_sha:
        return os.path.normpath(BUNDLED_RECOVER_STUDY)
    return None


def default_compress_runs(checkpoint_sha: str) -> Optional[str]:
    """The compress section's runs when --compress-runs is not given: the bundled model's, for that model only."""
    runs = frontier.rows(BUNDLED_COMPRESS_RUNS) if os.path.isdir(BUNDLED_COMPRESS_RUNS) else []
    return BUNDLED_COMPRESS_RUNS if runs and all(r["teacher_sha256"] == checkpoint_sha for r in runs) else None


def foreign_results(out: str, checkpoint_sha: str) -> List[Tuple[str, str]]:
    """(file, checkpoint sha256) of every result file in the folder (its own files, not inputs/) that names
    another checkpoint: a report renders the files of its folder, so they must all be this model's."""
    found = []
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        path = os.path.join(out, name)
        if not os.path.isfile(path) or not name.endswith((".json", ".jsonl")):
            continue
        try:
            if name.endswith(".jsonl"):
                with open(path, "rb") as f:
                    first = json.loads(f.readline() or b"{}")
                records = [first.get("header") or {}]
            else:
                data = read_json(path) or {}
                records = [data, data.get("meta") or {}, *(data.get("parts") or {}).values()]
        except (ValueError, OSError, AttributeError):
            continue  # not a results file: the part that reads it says so
        for record in records:
            sha = record.get("checkpoint_sha256") if isinstance(record, dict) else None
            if isinstance(sha, str) and sha != checkpoint_sha:
                found.append((path, sha))
                break
    return found


def check_own_folder(out: str, checkpoint_sha: str, checkpoint: str) -> None:
    """Refuse, in one line, a results folder holding another checkpoint's results (before any part runs)."""
    foreign = foreign_results(out, checkpoint_sha)
    if foreign:
        path, sha = foreign[0]
        more = f" (and {len(foreign) - 1} more files)" if len(foreign) > 1 else ""
        raise UserError(f"{path}{more} holds results of checkpoint {sha[:12]}, not of --path {checkpoint} "
                        f"({checkpoint_sha[:12]}): give that checkpoint's --path or another --results-dir")


def check_importance(path: str, checkpoint_sha: str, subset: str) -> bool:
    """True when DIR/importance.json is I_h of this checkpoint on this subset (reuse it); refuse another's."""
    data = read_json(path)
    if data is None:
        return False
    meta = data.get("meta", {})
    if (meta.get("checkpoint_sha256") != checkpoint_sha or meta.get("subset") != subset
            or meta.get("per_position") or not meta.get("normalized_by_layer", True)):
        theirs = str(meta.get("checkpoint_sha256"))[:12]
        raise UserError(f"{path} holds the importance of another run (checkpoint {theirs}, subset "
                        f"{meta.get('subset')!r}, per position {bool(meta.get('per_position'))}, normalised "
                        f"{meta.get('normalized_by_layer', True)}); use another --results-dir or delete the file")
    return True


def check_speed(path: str, options: speed.SpeedOptions, beam: int, checkpoint_sha: str) -> bool:
    """True when DIR/speed.json was measured with these settings on this checkpoint (reuse it)."""
    data = read_json(path)
    if data is None:
        return False
    sizes = sorted(int(b) for b in data.get("batch_sizes", {}))
    wanted = sorted(options.batch_size_list())
    heads = read_json(options.heads.lstrip("@")) or {}
    n_heads = sum(len(h) for layers in heads.values() for h in layers.values())
    same = ((data.get("beam"), data.get("subset"), data.get("heads_pruned"), data.get("runs"),
             data.get("num_sentences"), data.get("checkpoint_sha256"))
            == (beam, options.subset, n_heads, options.runs, options.num_sentences, checkpoint_sha))
    if sizes != wanted or not same:
        raise UserError(f"{path} was measured with other settings or another checkpoint (batch sizes {sizes}, beam "
                        f"{data.get('beam')}, {data.get('heads_pruned')} heads pruned, {data.get('runs')} runs); "
                        "use another --results-dir or delete the file")
    return True


class Ticker:
    """Progress lines while a part runs and no terminal shows fairseq's progress bars (a log file, CI): every
    `interval` seconds, the rows in the part's results file against the rows it will have."""

    def __init__(self, label: str, path: Optional[str], expected: Optional[int], interval: float = 60.0,
                 key_prefixes: Sequence[str] = ()):
        import threading

        self.label, self.path, self.expected, self.interval = label, path, expected, interval
        self.key_prefixes = [f'"key": "{p}'.encode() for p in key_prefixes]
        self.start = time.time()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def rows(self) -> Optional[int]:
        if not self.path or not os.path.exists(self.path):
            return None
        with open(self.path, "rb") as f:
            if not self.key_prefixes:
                return max(0, f.read().count(b"\n") - 1)  # minus the header line
            return sum(any(p in line for p in self.key_prefixes) for line in f)

    def _loop(self) -> None:
        while not self.stop.wait(self.interval):
            minutes = (time.time() - self.start) / 60
            done = self.rows()
            count = f", {done}/{self.expected} results" if done is not None and self.expected else ""
            print(f"{self.label}: running for {minutes:.1f} min{count}", flush=True)

    def __enter__(self):
        if not sys.stderr.isatty():
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()


def expected_rows(part: Part, layout, options: ReportOptions, out: str
                  ) -> Tuple[Optional[str], Optional[int], List[str]]:
    """The results file a part appends to, how many rows it has when the part is complete, and the key prefixes
    of those rows when the file holds others too (pruning.jsonl: the per-type curves)."""
    n = len(layout.all_heads())
    if part.name == "keep-one" and options.keep_one_select == "loss":  # the NLL pass over every head, then 1/layer
        return os.path.join(out, names.ablation_name("keep-one", "loss") + ".jsonl"), n + 1, []
    if part.name in ("single", "keep-one"):
        return os.path.join(out, names.ablation_name(part.name, "bleu") + ".jsonl"), n + 1, []
    if part.name == "prune":
        orders = [o.strip() for o in options.prune_orders.split(",") if o.strip()]
        whole_model = [f"{order}:{','.join(ATTENTION_TYPES)}:" for order in orders]
        return (os.path.join(out, names.PRUNING), len(orders) * len(steps(n, options.prune_step)), whole_model)
    if part.name == "shrink":
        sweep = part.commands[0][1].sweep_options()
        return os.path.join(out, shrink_sweep.SWEEP_LOG), 1 + len(sweep.percents) * len(sweep.methods), []
    return None, None, []  # prune-types shares pruning.jsonl with prune; the others have no row-per-step file


def run_parts(parts: Sequence[Part], state: State, out: str, options: ReportOptions, loaded, layout) -> None:
    total = len(parts)
    for i, part in enumerate(parts, start=1):
        prefix = f"report [{i}/{total}] {part.name}"
        if state.finished(part):
            print(f"{prefix}: done before, reused")
            continue
        if part.name == "score" and check_importance(os.path.join(out, names.IMPORTANCE), state.checkpoint_sha,
                                                     options.importance_subset or options.subset):
            print(f"{prefix}: {out}/{names.IMPORTANCE} is this checkpoint's I_h on that subset, reused")
            state.record(part, 0.0)
            continue
        if part.name == "speed":
            write_speed_heads(out, options.speed_percent, layout, state.checkpoint_sha)
            if check_speed(os.path.join(out, names.SPEED), part.commands[0][1], loaded.cfg.generation.beam,
                           state.checkpoint_sha):
                print(f"{prefix}: {out}/{names.SPEED} was measured with these settings, reused")
                state.record(part, 0.0)
                continue
        start = time.time()
        path, expected, key_prefixes = expected_rows(part, layout, options, out)
        with Ticker(prefix, path, expected, key_prefixes=key_prefixes):
            for line, (command, study_options) in zip(part.lines(), part.commands):
                print(f"{prefix}: {line}", flush=True)
                try:
                    run_study(command, study_options, loaded, out)
                except UserError as e:
                    raise UserError(f"part {part.name} ({command}): {e}") from None
        seconds = time.time() - start
        state.record(part, seconds)
        print(f"{prefix}: finished in {seconds / 60:.1f} min", flush=True)


def check(options: ReportOptions, parts: Dict[str, Part], out: str) -> None:
    """Everything that can be refused before the model is loaded: options, input files, each part's options."""
    wanted = options.part_names()
    oracle = "oracle" in [o.strip() for o in options.prune_orders.split(",")]
    single = os.path.join(out, names.ablation_name("single", "bleu") + ".jsonl")
    if "prune" in wanted and oracle and "single" not in wanted and not os.path.exists(single):
        raise UserError("--prune-orders oracle reads the single-head ablation: add single to --parts, or leave "
                        "oracle out of --prune-orders")
    options.masks_per_batch = parse_masks_per_batch(options.masks_per_batch)
    options.workers = parse_workers(options.workers)
    if options.keep_one_select not in ("bleu", "loss"):
        raise UserError(f"--keep-one-select must be bleu or loss, not {options.keep_one_select!r}")
    if options.references and not os.path.isfile(options.references):
        raise UserError(f"references not found: {options.references}")
    for flag, path in (("--l0-sweep", options.l0_sweep), ("--l0-encoder-sweep", options.l0_encoder_sweep),
                       ("--recover-study", options.recover_study)):
        if path and not os.path.isfile(path):
            raise UserError(f"{flag}: no such file: {path}")
    if options.compress_runs:
        if not os.path.isdir(options.compress_runs) or not frontier.rows(options.compress_runs):
            raise UserError(f"--compress-runs: no finished compress run in {options.compress_runs} (it takes a "
                            f"folder of `compress --out` folders: DIR/*/compress.json)")
    if not 0 < options.speed_percent < 100:
        raise UserError(f"--speed-percent must be in (0, 100), not {options.speed_percent}")
    pruning.PruneOptions(subset=options.subset, order=options.prune_orders, step=options.prune_step).orders()
    steps(1, options.prune_step)
    parts["speed"].commands[0][1].batch_size_list()
    for name, value in (("--speed-runs", options.speed_runs), ("--speed-sentences", options.speed_sentences)):
        if value < 1:
            raise UserError(f"{name} must be at least 1, not {value}")
    for part in parts.values():
        for _, study_options in part.commands:
            if isinstance(study_options, ablation.AblationOptions):
                study_options.check()
    if "deploy" in options.part_names():
        if not 0 < options.deploy_percent < 100:
            raise UserError(f"--deploy-percent must be in (0, 100), not {options.deploy_percent:g}")
        parts["deploy"].commands[0][1].check()
    if "shrink" in options.part_names():
        try:
            parts["shrink"].commands[0][1].sweep_options()
        except UserError as e:
            raise UserError(f"--shrink-percents/--shrink-methods: {e}") from None


def run(cfg, options: ReportOptions, base: Sequence[str], out: str) -> List[str]:
    """Run the parts not finished yet on one loaded model, then write the report; returns the files written.
    `base`: the user's fairseq options as given (for the command lines the report prints)."""
    all_parts = plan(options, base, out)
    check(options, all_parts, out)
    parts_wanted = options.part_names()
    if "deploy" in parts_wanted:
        ct2_decoding(cfg.generation)  # decoding options CTranslate2 cannot apply: refused before any part runs
    started = time.time()
    loaded = loading.load(cfg)
    if "deploy" in parts_wanted and not options.render_only:
        try:
            check_task(loaded.cfg.task)
        except UserError as e:
            raise UserError(f"part deploy: {e}: leave deploy out of --parts") from None
    checkpoint_sha = file_sha256(loaded.checkpoint)
    check_own_folder(out, checkpoint_sha, cfg.common_eval.path)
    layout = HeadLayout.of(loaded.model)
    subsets = sorted({options.subset, options.importance_subset or options.subset})

    def fingerprint(subset: str) -> str:  # refuses a missing or empty subset before any part runs
        return SubsetEvaluator(loaded, subset, options.references if subset == options.subset else None
                               ).data_fingerprint()

    fingerprints = {s: fingerprint(s) for s in subsets}
    per_part = {}
    for name in ([] if options.render_only else parts_wanted):
        try:
            per_part[name] = {s: fingerprints.get(s) or fingerprint(s) for s in all_parts[name].subsets}
        except UserError as e:
            raise UserError(f"part {name}: {e} (choose its subset with --{name}-calibration-subset or leave "
                            f"{name} out of --parts)") from None
    if options.dynamics is None:
        options.dynamics = default_dynamics(checkpoint_sha)
    if options.recover_study is None:
        options.recover_study = default_recover_study(checkpoint_sha)
    if options.compress_runs is None:
        options.compress_runs = default_compress_runs(checkpoint_sha)
    state = State(os.path.join(out, STATE), checkpoint_sha, fingerprints, per_part)
    if not options.render_only:
        with kept_pools():  # the sweeps' local workers start once, for every part
            run_parts([all_parts[p] for p in parts_wanted], state, out, options, loaded, layout)
    report_line = shlex.join(["fairseq-headprune", "report", *set_option(base, "--results-dir", out),
                              *options_argv(options)])
    doc, claim_rows, files = build_document(out, all_parts, state, options, layout, report_line, cfg)
    write_json_atomic(os.path.join(out, names.CLAIMS), {
        "inputs": {"single": files.single, "keep_one": files.keep_one, "keep_one_select": files.keep_one_select,
                   "keep_one_selection": files.keep_one_selection, "pruning": files.pruning, "speed": files.speed,
                   "dynamics": files.dynamics_path, "l0_sweep": files.l0_path,
                   "l0_encoder_sweep": files.l0_encoder_path,
                   "heads": len(layout.all_heads()),
                   "heads_per_layer": {f"{t}:{layer}": len(h) for (t, layer), h in layout.heads.items()}},
        "claims": [c.as_dict() for c in claim_rows]})
    md, html_path = os.path.join(out, names.REPORT_MD), os.path.join(out, names.REPORT_HTML)
    with atomic_output(md) as f:
        f.write(to_markdown(doc, out))
    with atomic_output(html_path) as f:
        f.write(to_html(doc))
    print(f"report finished in {(time.time() - started) / 60:.1f} min")
    return [md, html_path]


# ---------------------------------------------------------------- the document

def snapshot_inputs(out: str, dynamics: Optional[str], l0_sweep: Optional[str],
                    l0_encoder_sweep: Optional[str] = None) -> Tuple[Optional[str], ...]:
    """Copy the result files of other studies the claims read (and the L0 sweeps' figures) into DIR/inputs/, so
    that a report and its claims.json stay true to the files they were computed from when those files change.
    Returns the copies' paths (dynamics, L0 sweep, encoder-only L0 sweep), None where not given."""
    import shutil

    copies = []
    for path, name, flag in ((dynamics, "dynamics.jsonl", None), (l0_sweep, "l0-sweep.jsonl", "--l0-sweep"),
                             (l0_encoder_sweep, "l0-encoder-sweep.jsonl", "--l0-encoder-sweep")):
        if not path or not os.path.exists(path):
            if path and flag:
                raise UserError(f"{flag}: no such file: {path}")
            copies.append(path)
            continue
        target = os.path.join(out, names.INPUTS, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.abspath(path) != os.path.abspath(target):
            shutil.copyfile(path, target)
            figure = os.path.splitext(path)[0] + ".png"
            if flag and os.path.exists(figure):
                shutil.copyfile(figure, os.path.splitext(target)[0] + ".png")
        copies.append(target)
    return tuple(copies)


def snapshot_recover_study(out: str, path: Optional[str]) -> Optional[str]:
    """A copy of --recover-study (and the figure it names) in DIR/inputs/, as snapshot_inputs does for the others."""
    import shutil

    if not path:
        return None
    target = os.path.join(out, names.INPUTS, "recover-study.json")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.abspath(path) != os.path.abspath(target):
        shutil.copyfile(path, target)
        figure = (read_json(path) or {}).get("figure")
        if figure and os.path.exists(os.path.join(os.path.dirname(path), figure)):
            shutil.copyfile(os.path.join(os.path.dirname(path), figure), os.path.join(os.path.dirname(target), figure))
    return target


def snapshot_compress_runs(out: str, folder: Optional[str]) -> Optional[str]:
    """The rows of --compress-runs (and its controls) as DIR/inputs/compress-runs.json, written whole: what the
    section showed, kept beside the report as the other inputs are."""
    if not folder:
        return None
    target = os.path.join(out, names.INPUTS, "compress-runs.json")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with atomic_output(target) as f:
        shown = os.path.relpath(folder)  # as the user would type it: relative under the working directory
        json.dump({"folder": os.path.abspath(folder) if shown.startswith(os.pardir) else shown,
                   "rows": frontier.rows(folder),
                   "controls": frontier.controls(folder)}, f, indent=1)
    return target


def build_document(out: str, parts: Dict[str, Part], state: State, options: ReportOptions, layout, report_line: str,
                   cfg):
    """The report (and the claim rows and input files it was computed from)."""
    owners = {key: sections.whose(path, state.checkpoint_sha) for key, path in (
        ("dynamics", options.dynamics), ("l0", options.l0_sweep), ("l0_encoder", options.l0_encoder_sweep))}
    dynamics, l0, l0_encoder = snapshot_inputs(out, options.dynamics, options.l0_sweep, options.l0_encoder_sweep)
    files = sections.Files(out, dynamics, l0, options.keep_one_select, options.subset, l0_encoder,
                           {k: v for k, v in owners.items() if v})
    doc = Document(f"Attention heads of {os.path.basename(os.path.dirname(os.path.abspath(cfg.common_eval.path)))}"
                   f"/{os.path.basename(cfg.common_eval.path)}: fairseq-headprune report")
    sections.header(doc, files, cfg, options, state, layout)
    claim_rows = sections.evaluate_claims(files, parts, layout, options)
    sections.claims_table(doc, claim_rows)
    sections.importance(doc, files, parts["score"], state)
    sections.single(doc, files, parts["single"], state, layout)
    sections.keep_one(doc, files, parts["keep-one"], state, layout)
    sections.pruning(doc, files, parts["prune"], parts["prune-types"], state)
    sections.speed(doc, files, parts["speed"], state)
    sections.dynamics(doc, files)
    sections.voita(doc, files)
    sections.analysis(doc, files, parts["analyze"], state)
    sections.shrink(doc, files, parts["shrink"], state)
    sections.deploy(doc, files, parts["deploy"], state)
    sections.recover(doc, snapshot_recover_study(out, options.recover_study), state.checkpoint_sha)
    sections.compress(doc, out, snapshot_compress_runs(out, options.compress_runs), state.checkpoint_sha)
    sections.commands(doc, parts, state, report_line)
    return doc, claim_rows, files
