"""`fairseq-headprune report DATA --path CKPT --results-dir DIR`: the whole study of one model in one command.

Runs, in this process and with the fairseq options given here, the commands of every part: `score` (I_h),
`ablate --mode single` and `--mode keep-one`, `prune` (whole model by --prune-orders; each attention type alone
by importance), `speed` (the heads the importance order prunes at --speed-percent), and `analyze` when the
package has it. Then it checks the papers' claims against the result files (fairseq_headprune.claims) and writes
DIR/report.md and a self-contained DIR/report.html (figures embedded) with every table and figure, the sacreBLEU
signatures and the exact command line that produces or resumes each part; DIR/claims.json holds the claim rows
with the files they were computed from.

Reuse and resume: each command appends its results as it goes and resumes from its own files (refusing files of
another model, subset or decoding setup). DIR/report-state.json records each finished part with its command
lines and the checkpoint's hash: a finished part whose commands are unchanged is not run again. An interrupted
report therefore resumes inside the part it was in. Result files found in DIR without a state record (made by
the commands themselves) are resumed by those commands, which finish at once when nothing is missing.
"""
from __future__ import annotations

import datetime
import importlib
import importlib.util
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_headprune import claims as cl
from fairseq_headprune.document import Document, to_html, to_markdown
from fairseq_headprune.errors import UserError
from fairseq_headprune.heads import ATTENTION_TYPES
from fairseq_headprune.loading import PACKAGE_DIR, file_sha256
from fairseq_headprune.results.log import atomic_output, write_json_atomic

PARTS = ("score", "single", "keep-one", "prune", "prune-types", "speed", "analyze")
STATE = "report-state.json"
DEFAULT_DYNAMICS = os.path.join("results", "dynamics", "dynamics.jsonl")

# the report's own options: name -> takes a value (they are not passed on to the commands)
OWN_OPTIONS = {
    "--results-dir": True, "--parts": True, "--references": True, "--importance-subset": True,
    "--masks-per-batch": True, "--prune-orders": True, "--prune-step": True, "--speed-percent": True,
    "--speed-batch-sizes": True, "--speed-runs": True, "--speed-sentences": True, "--analyze-sentences": True,
    "--dynamics": True, "--l0-sweep": True, "--note": True, "--render-only": False, "--keep-one-select": True,
}


def add_args(parser) -> None:
    g = parser.add_argument_group("report")
    g.add_argument("--results-dir", required=True, help="folder of every part's results and of report.md/html")
    g.add_argument("--parts", default=",".join(PARTS),
                   help=f"parts to run, comma-separated, from {', '.join(PARTS)} (analyze: when installed)")
    g.add_argument("--references", help="raw reference file of --gen-subset (default: its decoded targets)")
    g.add_argument("--importance-subset", help="subset I_h is computed on (default: --gen-subset)")
    g.add_argument("--masks-per-batch", type=int, default=1, help="ablate, prune: masks sharing one beam search")
    g.add_argument("--keep-one-select", choices=["bleu", "loss"], default="bleu",
                   help="keep-one: choose each layer's head by BLEU on --gen-subset (every head decoded), or by "
                        "teacher-forced NLL on --importance-subset (or --gen-subset) and decode only the chosen "
                        "heads on --gen-subset (BLEU, significance): about 20x faster")
    g.add_argument("--prune-orders", default="importance,oracle,random", help="prune: orders of the whole-model curves")
    g.add_argument("--prune-step", type=float, default=0.1, help="prune: share of heads masked at each step")
    g.add_argument("--speed-percent", type=float, default=50.0,
                   help="speed: prune the heads the importance order prunes at this percent")
    g.add_argument("--speed-batch-sizes", default="1,4,16,64")
    g.add_argument("--speed-runs", type=int, default=3)
    g.add_argument("--speed-sentences", type=int, default=128)
    g.add_argument("--analyze-sentences", type=int, help="analyze: only the first N sentences (default: all)")
    g.add_argument("--dynamics", default=DEFAULT_DYNAMICS,
                   help="dynamics.jsonl of `dynamics` for claim C5 (default: the bundled model's training run)")
    g.add_argument("--l0-sweep", metavar="FILE",
                   help="result file of Voita's L0 λ sweep (`compare`) for the Voita claim")
    g.add_argument("--note", default="", help="a sentence for the report's header (e.g. how the data was sliced)")
    g.add_argument("--render-only", action="store_true",
                   help="run nothing: write the report from the result files already in --results-dir")
    _remember_argv(parser)


def _remember_argv(parser) -> None:
    """Keep the exact tokens this command was given (fairseq parses them with this parser), so each part's
    command line is the user's own fairseq options plus that part's options."""
    original = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        ns, rest = original(args, namespace)
        ns.report_argv = list(sys.argv[1:] if args is None else args)
        return ns, rest

    parser.parse_known_args = parse_known_args


# ---------------------------------------------------------------- command lines

def fairseq_argv(argv: Sequence[str]) -> List[str]:
    """The user's tokens without the report's own options and without the --user-dir the CLI adds."""
    out, i = [], 0
    argv = list(argv)
    if argv[:2] == ["--user-dir", PACKAGE_DIR]:
        argv = argv[2:]
    while i < len(argv):
        token = argv[i]
        name = token.split("=", 1)[0]
        if name in OWN_OPTIONS:
            i += 1 + (OWN_OPTIONS[name] and "=" not in token)
            continue
        out.append(token)
        i += 1
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


@dataclass
class Part:
    """One section of the study: the commands that produce its files."""

    name: str
    title: str
    commands: List[Tuple[str, List[str]]] = field(default_factory=list)  # (command, argv)

    def lines(self) -> List[str]:
        return [shlex.join(["fairseq-headprune", cmd, *argv]) for cmd, argv in self.commands]


def plan(args, base: List[str], out: str, subset: str) -> Dict[str, Part]:
    """Every part's commands, built from the user's fairseq options (`base`) and the report's options."""
    refs = ["--references", args.references] if args.references else []
    common = set_option(base, "--results-dir", out)
    importance = os.path.join(out, "importance.json")
    single = os.path.join(out, "ablation-single.jsonl")
    orders = [o.strip() for o in args.prune_orders.split(",") if o.strip()]
    step = ["--step", f"{args.prune_step:g}", "--masks-per-batch", str(args.masks_per_batch)]
    parts = {
        "score": Part("score", "Head importance", [
            ("score", set_option(common, "--gen-subset", args.importance_subset or subset))]),
        "single": Part("single", "Single-head ablation", [
            ("ablate", common + ["--mode", "single", "--masks-per-batch", str(args.masks_per_batch), *refs])]),
        "keep-one": Part("keep-one", "Keep one head per layer", [("ablate", common + keep_one_options(args, subset))]),
        "prune": Part("prune", "Pruning curves", [
            ("prune", common + ["--order", ",".join(orders), "--importance", importance]
             + (["--ablation", single] if "oracle" in orders else []) + step + refs)]),
        "prune-types": Part("prune-types", "Pruning each attention type alone", [
            ("prune", common + ["--order", "importance", "--types", t, "--importance", importance] + step + refs)
            for t in ATTENTION_TYPES]),
        "speed": Part("speed", "Speed", [
            ("speed", common + ["--heads", "@" + heads_file(out, args.speed_percent),
                                "--batch-sizes", args.speed_batch_sizes, "--runs", str(args.speed_runs),
                                "--num-sentences", str(args.speed_sentences)])]),
        "analyze": Part("analyze", "Head analysis", [
            ("analyze", common + ["--importance", importance]
             + (["--num-sentences", str(args.analyze_sentences)] if args.analyze_sentences else []))]),
    }
    return parts


def keep_one_options(args, subset: str) -> List[str]:
    """`ablate --mode keep-one`: BLEU of every head on the subset, or (--keep-one-select loss) each layer's head
    chosen by NLL on the importance subset and only those decoded on the subset, BLEU and significance."""
    options = ["--mode", "keep-one", "--masks-per-batch", str(args.masks_per_batch)]
    if args.keep_one_select == "bleu":
        return options + (["--references", args.references] if args.references else [])
    return options + ["--metric", "loss", "--select-subset", args.importance_subset or subset, "--report-subset",
                      subset, "--report-metric", "bleu"] + (["--report-references", args.references]
                                                            if args.references else [])


def heads_file(out: str, percent: float) -> str:
    return os.path.join(out, f"speed-heads-importance-{percent:g}.json")


def write_speed_heads(out: str, percent: float, layout) -> str:
    """The heads the whole-model importance order prunes at `percent` (what `prune` masks there), as a head file.

    Written by the report itself, so that the speed part does not depend on the prune part having run."""
    from fairseq_headprune.experiments.pruning import heads_to_json, importance_scores, rank_by_scores

    importance = os.path.join(out, "importance.json")
    if not os.path.exists(importance):
        raise UserError(f"speed needs {importance} (the score part) to choose the heads to prune: add score to --parts")
    candidates = layout.all_heads()
    ranking = rank_by_scores(importance_scores(importance), candidates)
    path = heads_file(out, percent)
    write_json_atomic(path, heads_to_json(ranking[: int(round(percent / 100 * len(candidates)))]))
    return path


def analysis_available() -> bool:
    return importlib.util.find_spec("fairseq_headprune.experiments.analysis") is not None


def parse_parts(text: str) -> List[str]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise UserError(f"--parts: unknown part {bad[0] if bad else text!r} (use {', '.join(PARTS)})")
    if "analyze" in parts and not analysis_available():
        if text != ",".join(PARTS):
            raise UserError("--parts analyze: this installation has no `analyze` command")
        parts.remove("analyze")
    return parts


# ---------------------------------------------------------------- running the parts

def run_command(command: str, argv: List[str]) -> None:
    """One command, in this process, exactly as `fairseq-headprune COMMAND ARGV` would run it."""
    from fairseq_headprune import cli

    module = importlib.import_module(cli.COMMANDS[command][0])
    cfg, args = cli.parse(command, module, list(argv))
    module.run(cfg, args)


class State:
    """DIR/report-state.json: the parts finished, with their command lines and the checkpoint they ran on."""

    def __init__(self, path: str, checkpoint_sha: str):
        self.path, self.checkpoint_sha = path, checkpoint_sha
        self.data = cl.read_json(path) or {"parts": {}}

    def finished(self, part: Part) -> bool:
        rec = self.data["parts"].get(part.name)
        return bool(rec and rec.get("finished") and rec.get("commands") == part.lines()
                    and rec.get("checkpoint_sha256") == self.checkpoint_sha)

    def record(self, part: Part, seconds: float) -> None:
        self.data["parts"][part.name] = {
            "commands": part.lines(), "checkpoint_sha256": self.checkpoint_sha, "seconds": round(seconds, 1),
            "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        write_json_atomic(self.path, self.data)

    def seconds(self, name: str) -> Optional[float]:
        return self.data["parts"].get(name, {}).get("seconds")


def check_importance(path: str, checkpoint_sha: str, subset: str) -> bool:
    """True when DIR/importance.json is I_h of this checkpoint on this subset (reuse it); refuse another's."""
    data = cl.read_json(path)
    if data is None:
        return False
    meta = data.get("meta", {})
    if meta.get("checkpoint_sha256") != checkpoint_sha or meta.get("subset") != subset:
        theirs = str(meta.get("checkpoint_sha256"))[:12]
        raise UserError(f"{path} holds the importance of another run (checkpoint {theirs}, subset "
                        f"{meta.get('subset')!r}); use another --results-dir or delete the file")
    return True


def check_speed(path: str, args, beam: int, subset: str) -> bool:
    """True when DIR/speed.json was measured with these settings (speed.json records them, not the model)."""
    data = cl.read_json(path)
    if data is None:
        return False
    sizes = sorted(int(b) for b in data.get("batch_sizes", {}))
    wanted = sorted(int(b) for b in args.speed_batch_sizes.split(","))
    heads = cl.read_json(heads_file(os.path.dirname(path), args.speed_percent)) or {}
    n_heads = sum(len(h) for layers in heads.values() for h in layers.values())
    same = (data.get("beam"), data.get("subset"), data.get("heads_pruned")) == (beam, subset, n_heads)
    if sizes != wanted or not same:
        raise UserError(f"{path} was measured with other settings (batch sizes {sizes}, beam {data.get('beam')}, "
                        f"{data.get('heads_pruned')} heads pruned); use another --results-dir or delete the file")
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


def expected_rows(part: Part, layout, args) -> Tuple[Optional[str], Optional[int], List[str]]:
    """The results file a part appends to, how many rows it has when the part is complete, and the key prefixes
    of those rows when the file holds others too (pruning.jsonl: the per-type curves)."""
    from fairseq_headprune.experiments.pruning import steps

    out = args.results_dir
    n = len(layout.all_heads())
    if part.name == "keep-one" and args.keep_one_select == "loss":  # the NLL pass over every head, then 1 per layer
        return os.path.join(out, "ablation-keep-one-loss.jsonl"), n + 1, []
    if part.name in ("single", "keep-one"):
        return os.path.join(out, f"ablation-{part.name}.jsonl"), n + 1, []
    if part.name == "prune":
        orders = [o.strip() for o in args.prune_orders.split(",") if o.strip()]
        whole_model = [f"{order}:{','.join(ATTENTION_TYPES)}:" for order in orders]
        return os.path.join(out, "pruning.jsonl"), len(orders) * len(steps(n, args.prune_step)), whole_model
    return None, None, []  # prune-types shares pruning.jsonl with prune; the others have no row-per-step file


def run_parts(parts: Sequence[Part], state: State, out: str, args, cfg, layout) -> None:
    subset = cfg.dataset.gen_subset
    total = len(parts)
    for i, part in enumerate(parts, start=1):
        prefix = f"report [{i}/{total}] {part.name}"
        if state.finished(part):
            print(f"{prefix}: done before, reused")
            continue
        if part.name == "score" and check_importance(os.path.join(out, "importance.json"), state.checkpoint_sha,
                                                     args.importance_subset or subset):
            print(f"{prefix}: {out}/importance.json is this checkpoint's I_h on that subset, reused")
            state.record(part, 0.0)
            continue
        if part.name == "speed":
            write_speed_heads(out, args.speed_percent, layout)
            if check_speed(os.path.join(out, "speed.json"), args, cfg.generation.beam, subset):
                print(f"{prefix}: {out}/speed.json was measured with these settings, reused")
                state.record(part, 0.0)
                continue
        start = time.time()
        path, expected, key_prefixes = expected_rows(part, layout, args)
        with Ticker(prefix, path, expected, key_prefixes=key_prefixes):
            for line, (command, argv) in zip(part.lines(), part.commands):
                print(f"{prefix}: {line}", flush=True)
                try:
                    run_command(command, argv)
                except UserError as e:
                    raise UserError(f"part {part.name} ({command}): {e}") from None
        seconds = time.time() - start
        state.record(part, seconds)
        print(f"{prefix}: finished in {seconds / 60:.1f} min", flush=True)


def run(cfg, args) -> None:
    out = args.results_dir
    parts_wanted = parse_parts(args.parts)
    checkpoint = cfg.common_eval.path
    if not checkpoint or not os.path.isfile(checkpoint):
        raise UserError(f"checkpoint not found: {checkpoint}")
    if args.references and not os.path.isfile(args.references):
        raise UserError(f"references not found: {args.references}")
    os.makedirs(out, exist_ok=True)
    base = fairseq_argv(args.report_argv)
    all_parts = plan(args, base, out, cfg.dataset.gen_subset)
    state = State(os.path.join(out, STATE), file_sha256(checkpoint))
    started = time.time()
    layout = _layout(cfg)
    if not args.render_only:
        run_parts([all_parts[p] for p in parts_wanted], state, out, args, cfg, layout)
    report_line = shlex.join(["fairseq-headprune", "report", *base, "--results-dir", out]
                             + _own_options_line(args.report_argv))
    doc, claim_rows, files = build_document(out, all_parts, state, args, layout, report_line, cfg)
    write_json_atomic(os.path.join(out, "claims.json"), {
        "inputs": {"single": files.single, "keep_one": files.keep_one, "keep_one_select": files.keep_one_select,
                   "keep_one_selection": files.keep_one_selection, "pruning": files.pruning, "speed": files.speed,
                   "dynamics": files.dynamics_path, "l0_sweep": files.l0_path,
                   "heads": len(layout.all_heads()),
                   "heads_per_layer": {f"{t}:{layer}": len(h) for (t, layer), h in layout.heads.items()}},
        "claims": [c.as_dict() for c in claim_rows]})
    md, html_path = os.path.join(out, "report.md"), os.path.join(out, "report.html")
    with atomic_output(md) as f:
        f.write(to_markdown(doc, out))
    with atomic_output(html_path) as f:
        f.write(to_html(doc))
    print(f"report finished in {(time.time() - started) / 60:.1f} min\nwrote {md}\nwrote {html_path}")


def _own_options_line(argv: Sequence[str]) -> List[str]:
    """The report's own options as given (but --results-dir, placed explicitly), for the rerun line."""
    out, i = [], 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in OWN_OPTIONS and name != "--results-dir":
            takes = OWN_OPTIONS[name] and "=" not in argv[i]
            out += argv[i : i + 1 + takes]
            i += 1 + takes
            continue
        i += 1 + (name == "--results-dir" and "=" not in argv[i])
    return out


def _layout(cfg):
    """The model's heads (for completeness checks and tables), from the checkpoint alone."""
    from fairseq_headprune.heads import HeadLayout
    from fairseq_headprune.loading import load

    return HeadLayout.of(load(cfg).model)


# ---------------------------------------------------------------- the document

def snapshot_inputs(out: str, dynamics: Optional[str], l0_sweep: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """Copy the result files of other studies the claims read (and the L0 sweep's figure) into DIR/inputs/, so
    that a report and its claims.json stay true to the files they were computed from when those files change."""
    import shutil

    copies = []
    for path, name in ((dynamics, "dynamics.jsonl"), (l0_sweep, "l0-sweep.jsonl")):
        if not path or not os.path.exists(path):
            if path and path == l0_sweep:
                raise UserError(f"--l0-sweep: no such file: {path}")
            copies.append(path)
            continue
        target = os.path.join(out, "inputs", name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.abspath(path) != os.path.abspath(target):
            shutil.copyfile(path, target)
            figure = os.path.splitext(path)[0] + ".png"
            if name == "l0-sweep.jsonl" and os.path.exists(figure):
                shutil.copyfile(figure, os.path.splitext(target)[0] + ".png")
        copies.append(target)
    return copies[0], copies[1]


def build_document(out: str, parts: Dict[str, Part], state: State, args, layout, report_line: str, cfg):
    """The report (and the claim rows and input files it was computed from)."""
    from fairseq_headprune.experiments import report_sections as sections

    files = sections.Files(out, *snapshot_inputs(out, args.dynamics, args.l0_sweep), args.keep_one_select,
                           cfg.dataset.gen_subset)
    doc = Document(f"Attention heads of {os.path.basename(os.path.dirname(os.path.abspath(cfg.common_eval.path)))}"
                   f"/{os.path.basename(cfg.common_eval.path)}: fairseq-headprune report")
    sections.header(doc, files, cfg, args, state, layout)
    claim_rows = sections.evaluate_claims(files, parts, layout, args)
    sections.claims_table(doc, claim_rows)
    sections.importance(doc, files, parts["score"], state)
    sections.single(doc, files, parts["single"], state, layout)
    sections.keep_one(doc, files, parts["keep-one"], state, layout)
    sections.pruning(doc, files, parts["prune"], parts["prune-types"], state)
    sections.speed(doc, files, parts["speed"], state)
    sections.dynamics(doc, files)
    sections.voita(doc, files)
    if analysis_available() or os.path.exists(files.analysis):
        sections.analysis(doc, files, parts["analyze"], state)
    sections.commands(doc, parts, report_line)
    return doc, claim_rows, files
