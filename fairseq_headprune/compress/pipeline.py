"""`compress`: from a user's checkpoint to a deployable model at a stated speed (or within a stated BLEU loss), in one
staged, resumable run.

Stages, each cached under OUT/stages/NAME/ by its identity (what it computes from, by content and value, and the
digest of the stage before it), so a rerun after kill -9 resumes at the first stage not finished, a changed option
reruns the stage it alters and every stage after it (never a mix), and a larger --budget-epochs extends recovery:

  cost-table  what each lever buys in the engine (compress.levers: crude shapes at equal work, interleaved; also
              cached per model, engine and CPU outside OUT), and which shapes (per-stack heads at every decoder
              depth) reach the target. A target no shape reaches is refused in one line here, before any long
              work.
  choice      the shape and its heads. --speedup: of the shapes that reach it, the one with the lowest Fisher estimate
              of the loss increase on calibration sentences of train (the per-stack Fisher fill of `shrink`); the
              heads of each layer in the order of its Fisher block; a shape that removes more than another
              candidate is tried after it (the joint estimate can fall as heads are added whose gradients
              cancel). Shapes that also cut the decoder's depth lose the layers `shrink --keep-layers` removes
              (greedy calibration loss, recorded); the Fisher estimate ranks shapes within a depth only, and the
              depths are ranked by the calibration NLL of their best shape (layers removed, heads masked, no
              reconstruction). The first few in that order (and the fastest) are timed again as crude slices, and
              at a depth where all of them miss the target, the next shape the measured speeds say will reach it;
              of those that measure the target, the one with the lowest calibration NLL of its own.
              --max-bleu-loss: the fastest shape of the frontier (predicted speed against Fisher estimate) whose
              shrunk model, before recovery, loses at most X BLEU in the engine on a held-out split of valid (its
              first --heldout-sentences by id, at most half, as the subset `heldout` of OUT/stages/choice/data;
              recovery early-stops on the rest), found by bisection. Before recovery is the conservative side:
              recovery lowers the loss further. This mode moves heads only (the Fisher frontier does not compare a
              depth cut with heads; recorded as `levers`).
  shrink      those heads (and decoder layers) removed and the model reconstructed (window fit 1000 steps, lr 3e-4,
              train calibration: the recipe the recover study measured best).
  recover     fairseq-train (compress.recover.recover): distillation from the unpruned model, early stopping on
              valid, resumable from its own checkpoints.
  export      CTranslate2 (ct2 engines): float32 parity against fairseq on valid, then the engine's compute type.
  measure     speed over the unpruned model in the same engine on valid sentences, at equal work and as decoded,
              interleaved in the same rounds; the FLOP ratio.
  report      --gen-subset decoded once by both models in the engine: BLEU, paired-bootstrap p. No choice reads it.

Then OUT/model.pt, OUT/ct2/, OUT/MODEL_CARD.md and OUT/compress.json, each written whole (compress.json last).
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import os
import resource
import shlex
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Tuple

from fairseq_headprune.compress import levers, preflight
from fairseq_headprune.compress.choice import (RETIMED_ROUNDS, SHAPE_FIELDS, TIMED_AGAIN, as_timed, candidate_order,
                                               ffn_variants, fisher_choice, kept_by_depth, label, lever_points,
                                               masked_nll, moved_levers, fisher_frontier, per_stack_points,
                                               pick_measured, reconstructed_nll, retime_candidates, shapes_reaching,
                                               shape_words)
from fairseq_headprune.compress.vocab_map import VocabMapOptions
from fairseq_headprune.compress.window_fit import WindowOptions
from fairseq_headprune.errors import UserError
from fairseq_headprune.options import nested, non_finite, option
from fairseq_headprune.compress import layers, model_card, recover, select
from fairseq_headprune.compress.export import ExportOptions, export
from fairseq_headprune.compress.reconstruct import ReconstructionOptions
from fairseq_headprune.compress.recover import DISTILL, RecoverOptions, TRAIN_DEFAULTS
from fairseq_headprune.compress.sequence_targets import language_pair
from fairseq_headprune.compress.shrink import (
    ShrinkOptions,
    calibrate,
    calibration_samples,
    shrink,
    with_fit,
    write_checkpoint,
)
from fairseq_headprune.core import flops
from fairseq_headprune.core.heads import attention_modules
from fairseq_headprune.core.masking import set_head_masks
from fairseq_headprune.core.shape import CeilingShape, ModelShape
from fairseq_headprune.core.surgery import remove_layers
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.fairseq_io.checkpoint_io import save_state
from fairseq_headprune.engines import fairseq_engine as deploy  # deploy.fairseq_run: fairseq's timed run
from fairseq_headprune.engines.ct2 import check_task, ct2_decoding, ct2_shape
from fairseq_headprune.engines.ct2_spec import unsupported_parts
from fairseq_headprune.fairseq_io.loading import load, load_other, load_subset
from fairseq_headprune.records.identity import calibration_files_sha256, decoding_identity, file_sha256
from fairseq_headprune.records.log import FolderLock, atomic_output, read_json, write_json_atomic
from fairseq_headprune.stats import BleuBootstrap

STAGES = ("cost-table", "choice", "shrink", "recover", "export", "measure", "report")
# the recovery's default budget: about the bundled De-En model's (4 epochs of its 28k pairs, 1008 updates of 2048
# tokens), whatever the corpus: a sample of 100k pairs, at most 1200 updates
BUDGET_UPDATES, RECOVER_SENTENCES = 1200, 100_000
HELDOUT = "heldout"  # the choice's split of valid (--max-bleu-loss)
BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED = 1000, 1


@dataclass
class CompressOptions:
    """What `fairseq-headprune compress` does; every field has the command's default."""

    out: str = option(flag="--out", metavar="DIR", help="the folder of the model, its card and its stages")
    speedup: Optional[float] = option(None, flag="--speedup",
                                      help="at least this many times the unpruned model's speed in --engine, at "
                                           "equal work")
    max_bleu_loss: Optional[float] = option(None, flag="--max-bleu-loss",
                                            help="instead: the fastest model that loses at most this much BLEU on a "
                                                 "held-out split of valid")
    shape: Optional[str] = option(None, flag="--shape", metavar="[L x]ENC/[L x]DEC[:ffn=P%]",
                                  help="build this shape instead of choosing one (heads kept per layer of each "
                                       "stack, each stack's layers and the share of every FFN's units "
                                       "optionally: 8/3, 6x8/3x3, 4x8/3, 8/3:ffn=75%%, as deploy --ceilings); which "
                                       "heads, layers and units go is chosen as for the choice's own and shrink's")
    engine: str = option("ct2-int8", flag="--engine", help=f"where the model runs: {', '.join(levers.ENGINES)}")
    budget_epochs: int = option(4, flag="--budget-epochs",
                                help="recovery epochs at most over the recovery set (early stopping on valid; a "
                                     "rerun with more extends; 0: no recovery)")
    budget_updates: int = option(BUDGET_UPDATES, flag="--budget-updates",
                                 help="recovery updates at most (fairseq-train's --max-update: the recovery stops at "
                                      "whichever of the two budgets comes first; a rerun with more extends). With "
                                      "--recover-sentences, the defaults hold a corpus of millions of pairs to about "
                                      "the bundled De-En model's budget (its 4 epochs of 28k pairs: 1008 updates)")
    recover_sentences: int = option(RECOVER_SENTENCES, flag="--recover-sentences",
                                    help="the recovery's training set: a random sample of this many pairs of train "
                                         "(seeded by --sample-seed, recorded; all of train when it holds fewer)")
    sample_seed: int = option(1, flag="--sample-seed",
                              help="seed of the random samples of train: the calibration sentences and the "
                                   "recovery set")
    gen_subset: str = "test"  # fairseq's --gen-subset: decoded once, at the end, to report
    references: Optional[str] = option(None, flag="--references",
                                       help="raw references of --gen-subset for BLEU (default: the binarised targets)")
    also_report: Tuple[str, ...] = option((), flag="--also-report", metavar="SUBSET[,SUBSET...]",
                                          parse=lambda text: comma_list(text),
                                          help="more sets decoded once, at the end, beside --gen-subset (a second "
                                               "test set): no choice or training of the run reads them")
    also_references: Tuple[str, ...] = option((), flag="--also-references", metavar="FILE[,FILE...]",
                                              parse=lambda text: comma_list(text),
                                              help="their raw references, in the same order (default: the "
                                                   "binarised targets)")
    teacher_trained_on: Tuple[str, ...] = option((), flag="--teacher-trained-on", metavar="SUBSET[,SUBSET...]",
                                                 parse=lambda text: comma_list(text),
                                                 help="--also-report sets the unpruned model was trained on: the "
                                                      "card labels them as its training data, apart from the "
                                                      "held-out results")
    calibration_subset: str = option("train", flag="--calibration-subset",
                                     help="sentences the heads are chosen and the model reconstructed on (never "
                                          "--gen-subset)")
    calibration_sentences: int = option(1000, flag="--calibration-sentences",
                                        help="how many of them, drawn at random over the subset (--sample-seed)")
    calibration_max_tokens: int = option(1000, flag="--calibration-max-tokens", help="tokens per calibration batch")
    window_steps: int = option(1000, flag="--window-steps",
                               help="Adam steps of each pruned attention sublayer's window fit (shrink --window-steps)")
    window_lr: float = option(WindowOptions.lr, flag="--window-lr", help="their learning rate (shrink --window-lr)")
    timing_subset: str = option("valid", flag="--timing-subset", help="sentences the speeds are measured on")
    timing_sentences: int = option(300, flag="--timing-sentences", help="how many of them")
    runs: int = option(3, flag="--runs",
                       help="interleaved timing rounds, at least (more when the timing batches are too few for every "
                            "sign test to see 10 paired batches)")
    latency_sentences: int = option(50, flag="--latency-sentences",
                                    help="sentences of --timing-subset decoded one at a time, for the latency at "
                                         "batch 1")
    heldout_sentences: int = option(500, flag="--heldout-sentences",
                                    help="--max-bleu-loss: the first N sentences of valid choose; the rest early-stop "
                                         "the recovery")
    check_sentences: int = option(100, flag="--check-sentences",
                                  help="sentences of the pruned-model and export checks")
    significance: float = option(levers.SIGNIFICANCE, flag="--significance",
                                 help="a cost-table row's time saving counts when its slice was faster in "
                                      "significantly more batches than not: sign test p below this (1: every "
                                      "measured saving counts)")
    distill: str = option("logits", flag="--distill", metavar="logits|sequences|both|none",
                          help="the recovery's signal (recover --distill): the teacher's token distributions on "
                               "the references; its beam translations of train as targets (Kim & Rush 2016, "
                               "decoded once and cached); both (the distributions on those translations); none")
    distill_hidden_weight: float = option(0.0, flag="--distill-hidden-weight",
                                          help="β of the recovery's hidden-state term: each kept decoder layer's "
                                               "output pulled towards the teacher layer the shrink reconstructed it "
                                               "towards (recover --distill-hidden-weight; 0: off)")
    distill_source: Tuple[str, ...] = option((), flag="--distill-source", metavar="FILE", nargs="+",
                                             parse=tuple,
                                             help="raw source text the unpruned model translates once (with the "
                                                  "model's --tokenizer and --bpe), trained on beside train: a "
                                                  "distillation set beyond the parallel data (recover "
                                                  "--distill-source)")
    distill_nbest: int = option(1, flag="--distill-nbest", metavar="N",
                                help="the unpruned model's N best translations of each --distill-source sentence, "
                                     "each a pair (recover --distill-nbest)")
    vocab_map: bool = option(False, flag="--vocab-map",
                             help="ct2 engines: ship a vocabulary map (vmap.txt, from the training pairs) the model is "
                                  "measured, checked and reported with: the output layer scores only the target "
                                  "words the batch's source words bring in (export-ct2 --vocab-map)")
    vocab_map_options: VocabMapOptions = nested(VocabMapOptions)
    recover_args: Tuple[str, ...] = option((), flag="--recover-args", metavar="'FAIRSEQ-TRAIN OPTIONS'",
                                           parse=lambda text: recover_args(text),
                                           help="fairseq-train options of the recovery, as one argument: "
                                                "--recover-args='--lr 3e-4' (device and distributed options too)")
    cost_cache: Optional[str] = option(None, flag="--cost-cache",
                                       help="folder of cost tables measured before (per model, engine, CPU; default "
                                            "~/.cache/fairseq-headprune/cost-tables); '' for none")
    stop_after: Optional[str] = option(None, flag="--stop-after", choices=STAGES,
                                       help="stop after this stage (the same command without it goes on); after "
                                            "shrink it prints the recovery's fairseq-train command, to run elsewhere "
                                            "(a GPU, a cluster) and continue with --recovered")
    recovered: Optional[str] = option(None, flag="--recovered", metavar="CKPT",
                                      help="a recovery run elsewhere (the checkpoint_best.pt of the fairseq-train "
                                           "command --stop-after shrink printed): checked to be a student of this "
                                           "run's shrink, then exported, measured and reported")
    dry_run: bool = option(False, flag="--dry-run",
                           help="print the plan (the stages, the data each reads, the estimate of each, the "
                                "recovery's fairseq-train command) and exit, writing nothing")
    train_options: Tuple[str, ...] = ()  # fairseq-train options given to compress itself (cli.compress): to recovery
    command: str = ""  # the command line as given, for the model card

    def check(self) -> None:
        """Every option applied or refused in one line, before anything loads."""
        non_finite(self)
        if (self.speedup is None) == (self.max_bleu_loss is None):
            raise UserError("give exactly one target: --speedup X (times the unpruned model's speed) or "
                            "--max-bleu-loss X (BLEU points on held-out data)")
        if self.speedup is not None and not self.speedup > 1:
            raise UserError(f"--speedup must be above 1, not {self.speedup:g}")
        if self.max_bleu_loss is not None and self.max_bleu_loss < 0:
            raise UserError(f"--max-bleu-loss must be at least 0, not {self.max_bleu_loss:g}")
        if self.shape is not None:
            if self.max_bleu_loss is not None:
                raise UserError("--shape gives the shape --max-bleu-loss would choose by BLEU: give --speedup X (the "
                                "speed it is judged against) with it")
            self.given_shape()
        if self.engine not in levers.ENGINES:
            raise UserError(f"--engine must be one of {', '.join(levers.ENGINES)}, not {self.engine!r}")
        for name in ("calibration_sentences", "calibration_max_tokens", "timing_sentences", "runs",
                     "check_sentences", "heldout_sentences", "latency_sentences", "budget_updates",
                     "recover_sentences"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(self, name)}")
        for name in ("budget_epochs", "window_steps"):
            if getattr(self, name) < 0:
                raise UserError(f"--{name.replace('_', '-')} must be at least 0, not {getattr(self, name)}")
        if not 0 < self.significance <= 1:
            raise UserError(f"--significance must be in (0, 1], not {self.significance:g}")
        if self.window_lr <= 0:
            raise UserError(f"--window-lr must be above 0, not {self.window_lr:g}")
        if not self.window_steps and self.window_lr != CompressOptions.window_lr:
            raise UserError("--window-lr sets the window fit's learning rate: it needs --window-steps N (above 0)")

        if self.distill not in DISTILL:
            raise UserError(f"--distill must be one of {', '.join(DISTILL)}, not {self.distill}")
        if self.budget_epochs == 0 and self.distill != "logits":
            raise UserError(f"--distill {self.distill}: --budget-epochs 0 runs no recovery")
        if self.distill_hidden_weight and self.distill in ("sequences", "none"):
            raise UserError(f"--distill-hidden-weight: --distill {self.distill} compares no states with the teacher "
                            "(logits or both do)")
        if self.budget_epochs == 0 and self.recover_args:
            raise UserError("--recover-args: --budget-epochs 0 runs no recovery")
        if self.budget_epochs == 0 and self.train_options:
            raise UserError(f"{self.train_options[0]}: a fairseq-train option, and --budget-epochs 0 runs no "
                            "recovery")
        if self.recovered is not None:
            if not os.path.isfile(self.recovered):
                raise UserError(f"--recovered: no such file: {self.recovered}")
            if self.budget_epochs == 0:
                raise UserError("--recovered: --budget-epochs 0 runs no recovery")

        if self.distill_hidden_weight < 0:
            raise UserError(f"--distill-hidden-weight must be at least 0, not {self.distill_hidden_weight:g}")
        if self.budget_epochs == 0 and self.distill_hidden_weight:
            raise UserError("--distill-hidden-weight: --budget-epochs 0 runs no recovery")
        if self.distill_source and self.budget_epochs == 0:
            raise UserError("--distill-source: --budget-epochs 0 runs no recovery")
        for path in self.distill_source:
            if not os.path.isfile(path):
                raise UserError(f"--distill-source: no such file: {path}")
        if self.distill_nbest != 1 and not self.distill_source:
            raise UserError("--distill-nbest sets how many translations of each --distill-source sentence are kept: "
                            "give --distill-source")
        if not 1 <= self.distill_nbest <= 5:  # recover's teacher beam
            raise UserError(f"--distill-nbest must be between 1 and 5 (the teacher's beam), not {self.distill_nbest}")
        if self.vocab_map and self.engine == "fairseq":
            raise UserError("--vocab-map is CTranslate2's (use_vmap): --engine fairseq cannot apply it")
        self.vocab_map_options.check()
        for name in ("calibration_subset", "timing_subset"):
            if getattr(self, name) == self.gen_subset:
                raise UserError(f"--{name.replace('_', '-')} {self.gen_subset} is --gen-subset: the reported set "
                                "must take part in no choice")
        if self.stop_after is not None and self.stop_after not in STAGES:
            raise UserError(f"--stop-after must be one of {', '.join(STAGES)}, not {self.stop_after!r}")
        if self.references and not os.path.isfile(self.references):
            raise UserError(f"--references: no such file: {self.references}")
        used = {self.calibration_subset: "--calibration-subset", self.gen_subset: "--gen-subset",
                "train": "the recovery's training set", "valid": "the recovery's early stopping"}
        for subset in self.also_report:
            if subset in used:
                raise UserError(f"--also-report {subset}: that is {used[subset]}; a reported set must be held out "
                                "of every choice and every training run")
        for subset in self.teacher_trained_on:
            if subset not in self.also_report:
                raise UserError(f"--teacher-trained-on {subset}: not an --also-report set (the sets it labels are "
                                "among those)")
        if len(set(self.also_report)) != len(self.also_report):
            raise UserError(f"--also-report names a set twice: {','.join(self.also_report)}")
        if self.also_references and len(self.also_references) != len(self.also_report):
            raise UserError(f"--also-references: {len(self.also_references)} file(s) for {len(self.also_report)} "
                            "--also-report set(s); give one per set, in the same order")
        for path in self.also_references:
            if not os.path.isfile(path):
                raise UserError(f"--also-references: no such file: {path}")
        if os.path.exists(self.out) and not os.path.isdir(self.out):
            raise UserError(f"--out {self.out} is a file; name a folder")
        if os.pathsep in os.path.abspath(self.out):  # found at the export of an 8-epoch run, after the training
            raise UserError(f"--out {self.out}: fairseq's --path splits a checkpoint path on '{os.pathsep}' (an "
                            f"ensemble), so the stages could not load the models written there; name a folder "
                            f"without it")

    def given_shape(self):
        """--shape as deploy's CeilingShape: heads per stack, the decoder's depth, the FFNs' share of units."""
        shape = CeilingShape.parse(self.shape, "--shape")
        if shape.vocab_percent < 100:
            raise UserError(f"--shape {self.shape}: the output layer cannot be removed yet (heads per stack, the "
                            "decoder's depth and the FFN units can)")
        return shape

    @property
    def target(self) -> str:
        return (f"--speedup {self.speedup:g}" if self.speedup is not None
                else f"--max-bleu-loss {self.max_bleu_loss:g}")


def keep_layers_spec(dec_layers: Optional[int] = None, enc_layers: Optional[int] = None) -> Optional[str]:
    """shrink's --keep-layers for a shape's depths (the choice's layer search reads the same counts)."""
    parts = [f"{s}:{n}" for s, n in (("dec", dec_layers), ("enc", enc_layers)) if n]
    return ",".join(parts) or None


def shrink_options(options: CompressOptions, heads: str, dec_layers: Optional[int] = None,
                   ffn_percent: float = 100.0, enc_layers: Optional[int] = None):
    """The one place compress builds shrink's options (the removed heads given: the choice made them; with a
    decoder depth, the layers shrink's importance selection keeps, the heads naming the kept layers renumbered;
    with an FFN share, the units shrink's mask Fisher keeps in every FFN, after the heads)."""
    fitted = bool(heads or dec_layers or enc_layers)  # the window fit refits sublayers that lost heads or inputs
    return ShrinkOptions(heads=heads or None, keep_layers=keep_layers_spec(dec_layers, enc_layers),
                         layer_selection="importance", ffn_keep=ffn_percent,
                         calibration_subset=options.calibration_subset,
                         calibration_sentences=options.calibration_sentences, calibration_seed=options.sample_seed,
                         check_sentences=options.check_sentences,
                         reconstruction=ReconstructionOptions(window=WindowOptions(
                             steps=options.window_steps if fitted else 0, lr=options.window_lr if fitted else
                             WindowOptions.lr)))


def calibration_only_options(options: CompressOptions):
    """shrink's options for the choice's calibration (the same sentences and batches as the shrink's)."""
    return ShrinkOptions(remove="1", calibration_subset=options.calibration_subset,
                         calibration_sentences=options.calibration_sentences, calibration_seed=options.sample_seed)


# --------------------------------------------------------------------------------------------- stages on disk


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


class StageStore:
    """OUT/stages/NAME/: a stage is done when its stage.json (identity and result, written atomically after
    everything else) holds this run's identity. Anything else found there is removed before the stage runs, except
    a resumable stage's own work (resume.json equal to this run's resume key)."""

    def __init__(self, out: str):
        self.root = os.path.join(out, "stages")

    def folder(self, name: str) -> str:
        return os.path.join(self.root, name)

    def record(self, name: str) -> Optional[Dict]:
        return read_json(os.path.join(self.folder(name), "stage.json"))

    def done(self, name: str, identity: Dict) -> Optional[Dict]:
        record = self.record(name)
        return record if record and record.get("identity") == identity else None

    def begin(self, name: str, resume_key: Optional[Dict] = None) -> str:
        folder = self.folder(name)
        keep = resume_key is not None and read_json(os.path.join(folder, "resume.json")) == resume_key
        if os.path.exists(os.path.join(folder, "stage.json")):
            os.remove(os.path.join(folder, "stage.json"))  # never vouches for what is about to replace it
        if not keep and os.path.exists(folder):
            shutil.rmtree(folder)
        os.makedirs(folder, exist_ok=True)
        if resume_key is not None:
            write_json_atomic(os.path.join(folder, "resume.json"), resume_key)
        return folder

    def finish(self, name: str, identity: Dict, result: Dict) -> Dict:
        record = {"identity": identity, "result": result}
        write_json_atomic(os.path.join(self.folder(name), "stage.json"), record)
        return record


class StageBar:
    """A progress bar per stage, its total the stage's estimate in seconds (so tqdm's ETA is the estimate's), moved
    by the clock from a thread and closed at the stage's real time."""

    def __init__(self, name: str, estimate: float, enabled: bool = True):
        self.name, self.estimate, self.enabled = name, max(estimate, 1.0), enabled

    def __enter__(self):
        if not self.enabled:
            return self
        from tqdm import tqdm

        import sys

        self.bar = tqdm(total=round(self.estimate), desc=f"{self.name:<10}", unit="s", leave=True,
                        mininterval=1 if sys.stderr.isatty() else 60,  # a log file gets a line a minute
                        bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} s [{elapsed}<{remaining}]")
        self.stop = threading.Event()
        self.start = time.time()

        def tick():
            while not self.stop.wait(1.0):
                n = min(int(time.time() - self.start), self.bar.total - 1)
                if n > self.bar.n:
                    self.bar.update(n - self.bar.n)

        self.thread = threading.Thread(target=tick, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return
        self.stop.set()
        self.thread.join()
        spent = int(time.time() - self.start)
        self.bar.total = max(spent, 1)
        self.bar.update(self.bar.total - self.bar.n)
        self.bar.close()


# --------------------------------------------------------------------------------------------- measured rates


@contextlib.contextmanager
def max_tokens(loaded, value: Optional[int]):
    """Batches of at most `value` tokens while calibrating (the recipe's --max-tokens 1000), restored after."""
    from omegaconf import open_dict

    saved = loaded.cfg.dataset.max_tokens
    with open_dict(loaded.cfg):
        loaded.cfg.dataset.max_tokens = value
    try:
        yield
    finally:
        with open_dict(loaded.cfg):
            loaded.cfg.dataset.max_tokens = saved


def cpu_seconds(fn, repeat: int = 2) -> float:
    """CPU seconds of this process (every thread) for one call of fn, the least of `repeat` calls (the first pays
    for allocations and caches): what a stage costs whatever else the machine runs meanwhile."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return max(best, 1e-6)


def probe(loaded, options: CompressOptions, timing, calibration) -> Dict[str, float]:
    """Rates measured on this machine now, in CPU time, a few seconds: decoding (sentences/s) in the engine and in
    fairseq, the export of the model, a forward and a forward+backward of a training batch (target tokens/s), one
    window-fit step."""
    import torch

    rates = {}
    few = timing[:2]
    n = sum(s["id"].numel() for s in few)
    with tempfile.TemporaryDirectory(prefix="compress-probe-") as tmp:
        holder = {}

        def build():
            shutil.rmtree(os.path.join(tmp, "m"), ignore_errors=True)
            holder["m"] = levers.EngineModel(loaded, options.engine, folder=os.path.join(tmp, "m"))

        rates["export_s"] = cpu_seconds(build, 1) if options.engine != "fairseq" else 0.0
        if "m" not in holder:
            build()
        seconds = cpu_seconds(lambda: holder["m"].run(few))
    pad = loaded.task.target_dictionary.pad()
    rates["engine_sent_s"] = n / seconds  # and per reference token: the reported sets' sentences are longer or not
    rates["engine_tok_s"] = sum(int(s["target"].ne(pad).sum()) for s in few) / seconds
    rates["fairseq_sent_s"] = (rates["engine_sent_s"] if options.engine == "fairseq" else
                               n / cpu_seconds(lambda: deploy.fairseq_run(loaded, loaded.model, few)))
    sample = calibration[len(calibration) // 2]  # a full training batch of middling sentences
    tokens = int(sample["target"].ne(pad).sum())
    model = loaded.model

    def forward():
        with torch.no_grad():
            model(**sample["net_input"])

    def train_step():
        out = model(**sample["net_input"])[0]
        out.float().logsumexp(-1).sum().backward()
        model.zero_grad(set_to_none=True)

    rates["forward_tok_s"] = tokens / cpu_seconds(forward)
    rates["train_tok_s"] = tokens / cpu_seconds(train_step)
    attn = next(iter(attention_modules(model).values()))
    x = torch.randn(25, 40, attn.embed_dim)  # one window-fit step: at most 1000 tokens

    def window_step():
        y, _ = attn(query=x, key=x, value=x, need_weights=False)
        y.pow(2).sum().backward()

    rates["window_step_s"] = cpu_seconds(window_step, 3)
    for p in attn.parameters():
        p.grad = None
    return rates


def subset_tokens(loaded, subset: str, n: Optional[int] = None) -> Tuple[int, int]:
    """(sentences, target tokens) of the first n sentences of a subset (all when n is None)."""
    dataset = load_subset(loaded, subset)
    count = len(dataset) if n is None else min(n, len(dataset))
    sizes = getattr(dataset, "tgt_sizes", None)
    tokens = int(sizes[:count].sum()) if sizes is not None else count * 20
    return count, tokens


def estimates(loaded, options: CompressOptions, rates: Dict[str, float], rows: int,
              rounds: Optional[int] = None) -> Dict[str, float]:
    """Seconds each stage will take, from the measured rates (not guesses of them); `rounds`: the timing's
    interleaved rounds (levers.timing_rounds; --runs when not given)."""
    timing_n = options.timing_sentences
    runs = rounds or options.runs
    engine = rates["engine_sent_s"]
    calib_n, calib_tok = subset_tokens(loaded, options.calibration_subset, options.calibration_sentences)
    train_n, train_tok = subset_tokens(loaded, "train")
    valid_n, valid_tok = subset_tokens(loaded, "valid")
    sublayers = len(attention_modules(loaded.model))
    out = {"cost-table": (rows + 1) * ((runs + 2) * timing_n / engine + rates["export_s"])}
    out["choice"] = calib_tok / rates["train_tok_s"]
    if options.speedup is not None:  # up to five shapes timed again beside the unpruned model, and (expected) one
        models = 2 if options.shape is not None else 6 + 6  # more round of five (ffn_variants, retime_candidates)
        out["choice"] += models * ((runs + 2) * timing_n / engine + rates["export_s"])
        depth = len(loaded.model.decoder.layers)  # at most: the greedy layer order down to one layer, a gradient
        out["choice"] += ((depth * (depth + 1) // 2 - 1 + depth) * calib_tok / rates["forward_tok_s"]  # pass and
                          + (depth - 1) * calib_tok / rates["train_tok_s"])  # an NLL per depth
        if options.shape is None:  # (expected) three timed shapes reach the target, each compared by its NLL after
            out["choice"] += 3 * 3 * calib_tok / rates["forward_tok_s"]  # shrink's closed-form fits
    shrink = (options.window_steps * sublayers * rates["window_step_s"] + 3 * calib_tok / rates["forward_tok_s"]
              + 2 * min(options.check_sentences, calib_n) / rates["fairseq_sent_s"])
    if options.max_bleu_loss is not None:  # shrinks and held-out decodes: a bisection over the frontier, whose
        held = min(options.heldout_sentences, valid_n)  # ~20 shapes took 5 probes on the bundled models
        probes = math.ceil(math.log2(max(2, len(per_stack_points(loaded.model)) // 3)))
        out["choice"] += probes * (shrink + held / rates["fairseq_sent_s"]) + held / rates["fairseq_sent_s"]
    out["shrink"] = shrink
    sample_n = min(options.recover_sentences, train_n)  # the recovery set, its epochs capped by the updates
    sample_tok = train_tok * sample_n / max(train_n, 1)
    epochs = min(float(options.budget_epochs), options.budget_updates / updates_per_epoch(sample_tok, options))
    out["recover"] = epochs * (sample_tok / rates["train_tok_s"] + sample_tok / rates["forward_tok_s"]
                               + valid_tok / rates["forward_tok_s"])
    if options.distill in ("sequences", "both"):  # the teacher's translations of train (cached: once per teacher)
        out["recover"] += sample_n / rates["fairseq_sent_s"]
    if options.recovered:  # run elsewhere: only adopted here
        out["recover"] = 0.0
    out["export"] = (2 * options.check_sentences / rates["fairseq_sent_s"] + 2 * rates["export_s"]
                     if options.engine != "fairseq" else 0.0)
    out["measure"] = 2 * (2 * runs + 2) * timing_n / engine + rates["export_s"]
    reported = sum(subset_tokens(loaded, subset)[1] for subset in (options.gen_subset, *options.also_report))
    out["report"] = 2 * reported / rates["engine_tok_s"]  # both models, every reported set
    return out


def updates_per_epoch(target_tokens: float, options: CompressOptions) -> float:
    """About how many updates an epoch of `target_tokens` takes in the recovery's batches (its --max-tokens, the
    bundled model's batches three quarters full of target tokens: 252 updates an epoch of De-En's 28k pairs)."""
    given = list(options.recover_args) + list(options.train_options)
    max_tokens = next((given[i + 1] for i, a in enumerate(given[:-1]) if a == "--max-tokens"),
                      TRAIN_DEFAULTS["--max-tokens"])
    return max(1.0, target_tokens / (0.75 * int(max_tokens)))


def split_subsets(train_options: Tuple[str, ...]) -> Tuple[str, str, List[str]]:
    """fairseq-train's --train-subset and --valid-subset among the training options given to compress (recover sets
    them itself, from RecoverOptions), and the other options."""
    subsets, rest, given = {"--train-subset": "train", "--valid-subset": "valid"}, [], list(train_options)
    i = 0
    while i < len(given):
        name, _, value = given[i].partition("=")
        if name in subsets:
            if not value:
                i += 1
                value = given[i]
            subsets[name] = value
        else:
            rest.append(given[i])
        i += 1
    return subsets["--train-subset"], subsets["--valid-subset"], rest


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to n for the block, restored after."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


# --------------------------------------------------------------------------------------------- the choice

def split_valid(loaded, out: str, heldout: int) -> Tuple[str, Dict]:
    """A data folder beside the user's: every file linked, except valid, whose binarised sentences are split by id:
    the first `heldout` (at most half) become the subset HELDOUT, the rest the subset valid. Returns the folder and
    the split (id ranges, half-open)."""
    import glob

    from fairseq.data import data_utils, indexed_dataset

    source = loaded.cfg.task.data.split(os.pathsep)[0]
    prefixes = sorted({p[:-4] for p in glob.glob(os.path.join(source, "valid.*.bin"))})
    if not prefixes:
        raise UserError(f"--max-bleu-loss splits valid, and {source} has no binarised valid subset")
    staged = out + ".partial"
    shutil.rmtree(staged, ignore_errors=True)
    os.makedirs(staged)
    for path in glob.glob(os.path.join(source, "*")):  # (a user's own HELDOUT files would be written through)
        if os.path.isfile(path) and not os.path.basename(path).startswith(("valid.", HELDOUT + ".")):
            os.symlink(os.path.abspath(path), os.path.join(staged, os.path.basename(path)))
    vocab = max(len(loaded.task.source_dictionary), len(loaded.task.target_dictionary))
    sizes = set()
    split = {}
    for prefix in prefixes:
        dataset = data_utils.load_indexed_dataset(prefix, None)
        n = len(dataset)
        sizes.add(n)
        cut = min(heldout, n // 2)
        if cut < 1:
            raise UserError(f"--max-bleu-loss: valid has {n} sentence(s), too few to hold any out")
        split = {"heldout": [0, cut], "valid": [cut, n]}
        rest = os.path.basename(prefix)[len("valid"):]
        for name, (a, b) in (("heldout", (0, cut)), ("valid", (cut, n))):
            target = os.path.join(staged, name + rest)
            builder = indexed_dataset.make_builder(target + ".bin", impl="mmap", vocab_size=vocab)
            for i in range(a, b):
                builder.add_item(dataset[i])
            builder.finalize(target + ".idx")
    if len(sizes) != 1:
        raise UserError(f"valid's files in {source} hold different numbers of sentences ({sorted(sizes)})")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(staged, out)
    return out, split


# --------------------------------------------------------------------------------------------- the run


class Run:
    """One compress run over a loaded (unpruned) model."""

    def __init__(self, loaded, options: CompressOptions, log: Callable = print, progress: bool = True):
        self.loaded, self.options, self.log, self.progress = loaded, options, log, progress
        self.store = StageStore(options.out)
        self.results: Dict[str, Dict] = {}
        self.previous = ""  # digest of the last stage's record
        self.spent: Dict[str, float] = {}

    @property
    def cost_cache(self) -> Optional[str]:
        """The folder of cost tables measured before: --cost-cache, the user's cache by default, none for ''."""
        given = self.options.cost_cache
        return levers.default_cache() if given is None else (given or None)

    # -- the stage machinery

    def stage(self, name: str, identity: Dict, build: Callable[[str], Dict], estimate: float = 0.0,
              resume_key: Optional[Dict] = None) -> Dict:
        identity = json.loads(json.dumps({"after": self.previous, **identity}, default=str))  # as stored
        record = self.store.done(name, identity)
        if record is None:
            folder = self.store.begin(name, resume_key)
            start, cpu = time.perf_counter(), time.process_time()
            with StageBar(name, estimate, self.progress):
                result = build(folder)
            result["seconds"] = round(time.perf_counter() - start, 1)
            result["cpu_seconds"] = round(time.process_time() - cpu, 1)  # this call's (a resumed stage: its rest)
            result["estimated_cpu_seconds"] = round(estimate, 1)
            record = self.store.finish(name, identity, result)
            self.log(f"{name}: done in {result['seconds']:.0f}s ({result['cpu_seconds'] / 60:.1f} CPU minutes; "
                     f"estimated {estimate / 60:.1f})")
        else:
            self.log(f"{name}: cached ({self.store.folder(name)})")
        self.previous = digest(record)
        self.results[name] = record["result"]
        return record["result"]

    def stop_here(self, name: str) -> bool:
        if self.options.stop_after == name:
            self.log(f"stopped after {name} (--stop-after); the same command without it goes on from here")
            return True
        return False

    # -- the stages

    def check(self) -> None:
        """Every refusal the loaded model and data can give, in one line, before OUT is made or anything runs."""
        options, loaded = self.options, self.loaded
        if options.engine != "fairseq":  # CTranslate2 decodes as fairseq under translation and the multilingual task
            check_task(loaded.cfg.task, f"compress --engine {options.engine}", "; --engine fairseq compresses it")
            ct2_decoding(loaded.cfg.generation)
            activation = getattr(loaded.saved_cfg.model, "activation_fn", None) or "relu"
            problems = unsupported_parts(loaded.model, activation)
            if problems:
                raise UserError(f"--engine {options.engine}: CTranslate2 cannot express {problems[0]}")
        preflight.check(self)  # references, BPE files, the recovery's fairseq-train options against this machine
        self.check_recover_args()
        for subset in ("train", "valid", options.gen_subset, options.calibration_subset, options.timing_subset,
                       *options.also_report):
            subset_tokens(loaded, subset, 1)
        if options.shape is not None:
            self.shape_point()

    def run(self) -> Optional[Dict]:
        import torch

        set_head_masks(self.loaded.model, [])
        threads = self.threads = torch.get_num_threads()  # the recovery's (OMP_NUM_THREADS, else every core)
        torch.set_num_threads(1)
        try:
            return self._run()
        finally:
            torch.set_num_threads(threads)

    def _run(self) -> Optional[Dict]:
        options, loaded = self.options, self.loaded
        timing = self.timing = levers.timing_batches(loaded, options.timing_subset, options.timing_sentences)
        self.rounds = levers.timing_rounds(len(timing), options.runs)

        train_tokens = int(TRAIN_DEFAULTS["--max-tokens"])  # a batch as recovery trains on (the probe's rates)
        with max_tokens(loaded, train_tokens):
            calibration, _ = calibration_samples(loaded, "train", 200, train_tokens)
        table_identity = levers.table_identity(loaded, options.engine, timing, self.rounds)
        rows = len(levers.lever_rows(loaded.model))
        rates = probe(loaded, options, timing, calibration)
        plan = estimates(loaded, options, rates, rows, self.rounds)
        cached = self._cached_stages(table_identity)
        todo = {name: (0.0 if name in cached else s) for name, s in plan.items()}
        done_epochs = self._recovered_epochs(cached)
        if done_epochs and options.budget_epochs:  # an extension trains the epochs not yet trained
            todo["recover"] *= max(options.budget_epochs - done_epochs, 0) / options.budget_epochs
        self.log(f"compress ({options.target}, {options.engine}): this run will cost about "
                 f"{sum(todo.values()) / 60:.1f} CPU minutes on this machine ("
                 + ", ".join(f"{n} {'cached' if n in cached else f'{s / 60:.1f}'}" for n, s in todo.items())
                 + f"; from rates measured just now in CPU time: {rates['engine_sent_s']:.0f} sentences/s in "
                 f"{options.engine}, {rates['train_tok_s']:.0f} training tokens/s)")
        self.rates, self.plan, self.todo = rates, plan, todo
        if self.rounds > options.runs:
            self.log(f"timing: {len(timing)} batches of '{options.timing_subset}', so {self.rounds} interleaved rounds "
                     f"(--runs {options.runs}) give every sign test at least {levers.MIN_PAIRED} paired batches")
        if options.dry_run:
            for line in self.plan_lines(todo, cached):
                self.log(line)
            return None
        plan = todo  # each stage's bar: what is left of it

        table = self.stage("cost-table", table_identity, lambda folder: self._cost_table(folder, table_identity),
                           plan["cost-table"])
        points = self._reachable(table)
        if self.stop_here("cost-table"):
            return None
        choice = self.stage("choice", self._choice_identity(points), lambda folder: self._choice(folder, points),
                            plan["choice"])
        if self.stop_here("choice"):
            return None
        shrunk = self.stage("shrink", {"options": self._shrink_identity(choice)},
                            lambda folder: self._shrink(folder, choice), plan["shrink"])
        if self.options.stop_after == "shrink" and self.options.budget_epochs:
            self._write_recovery_script(shrunk)
        if self.stop_here("shrink"):
            return None
        recovered = self._recover_stage(shrunk)
        if self.stop_here("recover"):
            return None
        export_key = {"engine": options.engine, "check_sentences": options.check_sentences}
        if options.vocab_map:  # (absent without one: the records of runs before the option still resume)
            export_key["vocab_map"] = asdict(options.vocab_map_options)
        exported = self.stage("export", export_key,
                              lambda folder: self._export(folder, recovered), plan["export"])
        if self.stop_here("export"):
            return None
        measured = self.stage("measure", {"timing": table_identity, "engine": options.engine,
                                          "latency_sentences": options.latency_sentences},
                              lambda folder: self._measure(folder, recovered, exported, timing), plan["measure"])
        if self.stop_here("measure"):
            return None

        reported = self.stage("report", {"gen_subset": options.gen_subset, "references": self._references_sha(),
                                         "also": [[s, self._references_sha(s, r)] for s, r in self._also()],
                                         "decoding": decoding_identity(loaded.cfg)},
                              lambda folder: self._report(folder, recovered, exported), plan["report"])
        if self.stop_here("report"):
            return None
        return self._write_outputs(table, points, choice, shrunk, recovered, exported, measured, reported)

    def plan_lines(self, estimate: Dict[str, float], cached: set) -> List[str]:
        """--dry-run: every stage with the data it reads and its estimate, then the recovery's fairseq-train
        command."""
        o = self.options
        data, sample = self._recovery_set(prepare=False)
        calibration = (f"{o.calibration_sentences} sentences of '{o.calibration_subset}' drawn at random (seed "
                       f"{o.sample_seed})")
        recovery = (f"{sample['sentences']} of the {sample['of']} pairs of '{sample['subset']}'"
                    + (f" drawn at random (seed {o.sample_seed})" if sample["sampled"] else "")
                    + f"; early stopping on 'valid'; at most {o.budget_epochs} epochs and {o.budget_updates} updates"
                    if o.budget_epochs else "nothing: --budget-epochs 0")
        reads = {"cost-table": f"{sum(s['id'].numel() for s in self.timing)} sentences of '{o.timing_subset}' in "
                               f"{len(self.timing)} batches, {self.rounds} interleaved rounds",
                 "choice": calibration + (f"; the first {o.heldout_sentences} of 'valid' (held out)"
                                          if o.max_bleu_loss is not None else ""),
                 "shrink": calibration, "recover": recovery,
                 "export": f"{o.check_sentences} sentences of '{o.timing_subset}'",
                 "measure": f"the cost table's batches of '{o.timing_subset}'",
                 "report": ", ".join(f"'{s}'" for s in (o.gen_subset, *o.also_report))}
        lines = [f"plan (--dry-run: nothing was written): {o.out}"]
        for name in STAGES:
            if o.recovered and name == "recover":
                what = f"--recovered {o.recovered} (a recovery run elsewhere)"
            else:
                what = reads[name]
            lines.append(f"  {name:<10} {'cached' if name in cached else f'{estimate[name] / 60:.1f} CPU min'}: "
                         f"{what}")
        if o.budget_epochs and not o.recovered:
            lines.append("the recovery's command (run by the recover stage; or elsewhere after --stop-after shrink):")
            lines.append("  " + self.recovery_command(data))
        return lines

    def _recovered_epochs(self, cached: set) -> int:
        """Epochs a recovery of this run's shrink already trained (its record, of another budget)."""
        record = self.store.record("recover")
        if "shrink" not in cached or "recover" in cached or not record:
            return 0
        shrink = self.store.record("shrink")
        if record["identity"].get("after") != digest(shrink):
            return 0
        return int(record["result"].get("budget_epochs") or 0)

    def check_recover_args(self) -> None:
        """fairseq-train's options of the recovery, refused in one line before any work (as recover refuses them)."""
        if not self.options.budget_epochs:
            if self.options.recover_args:
                raise UserError("--recover-args: --budget-epochs 0 runs no recovery")
            return
        model_cfg = self.loaded.saved_cfg.model
        arch = model_cfg.get("arch") if hasattr(model_cfg, "get") else getattr(model_cfg, "arch", None)
        _, _, train_options = split_subsets(self.options.train_options)
        instead = {"--max-update": "--budget-updates N", "--max-epoch": "--budget-epochs N",
                   "--train-subset": "--train-subset to compress itself", "--valid-subset":
                   "--valid-subset to compress itself"}
        for name in recover.option_names(list(self.options.recover_args)):
            if name in instead:
                raise UserError(f"--recover-args: {name} is the recovery's budget or data, which compress sets: give "
                                f"{instead[name]}")
        recover.refuse_foreign_options(train_options + list(self.options.recover_args), arch or "transformer")
        if "--disable-validation" in train_options + list(self.options.recover_args):
            raise UserError("--disable-validation: the recovery early-stops on valid and keeps its best checkpoint")
        options = self._recover_options(os.path.join(self.options.out, "model.pt"), None)
        argv = recover.training_argv(self.loaded.cfg.task.data, self.loaded.checkpoint, options,
                                     self.loaded.cfg.task._name, arch or "transformer")
        recover.fairseq_train_cfg(argv, self.loaded.saved_cfg, options)
        if options.distill in ("sequences", "both"):  # what recover would refuse after the choice and the shrink
            recover.refuse_teacher_decoding(options.distill, recover.saved_task_name(self.loaded.saved_cfg))

            language_pair(self.loaded.cfg.task.data, options.train_subset)

    def _cached_stages(self, table_identity: Dict) -> set:
        """The stages a rerun will find done: the cost table by its identity (here or in the cache); each later one
        when its record follows the record before it (an option changed since may still rerun it)."""
        cached = set()
        record = self.store.done("cost-table", {"after": "", **table_identity})
        if record is None and not levers.cached_table(self.cost_cache, table_identity):
            return cached
        cached.add("cost-table")
        for name in STAGES[1:]:
            if record is None:
                break
            following = self.store.record(name)
            if not following or following["identity"].get("after") != digest(record):
                break
            if name == "recover" and (following["identity"].get("budget_epochs") != self.options.budget_epochs
                                      or following["identity"].get("budget_updates") != self.options.budget_updates):
                break
            cached.add(name)
            record = following
        return cached

    # cost table

    def _cost_table(self, folder: str, identity: Dict) -> Dict:
        cached = levers.cached_table(self.cost_cache, identity)
        if cached:
            self.log(f"cost table: measured before on this machine ({self.cost_cache})")
            return {**cached, "from_cache": True}
        table = levers.measure(self.loaded, self.options.engine, self.timing, self.rounds, log=self.log)
        table["identity"] = identity
        if not levers.decided(table):  # never cached: a rerun measures again rather than reuse an undecided table
            self.log(f"cost table: its rows saw as few as {levers.fewest_paired(table)} paired batches, fewer than "
                     f"{levers.MIN_PAIRED}: not kept in the cache")
            return {**table, "from_cache": False, "cache_file": None}
        stored = levers.store_table(self.cost_cache, table)
        return {**table, "from_cache": False, "cache_file": stored}

    def _reachable(self, table: Dict) -> List[Dict]:
        """Every point (per-stack shapes, at every decoder depth) with its predicted speed; the target's reachable
        ones, or a refusal in one line."""
        levers.smooth(table["rows"], self.options.significance)
        points = lever_points(self.loaded.model)
        for p in points:
            p["predicted_speedup"] = round(levers.predict(table, p), 4)
        points.sort(key=lambda p: -p["predicted_speedup"])
        order = ", ".join(f"{name} {speed:.2f}x" for name, speed in levers.lever_order(table))
        self.log(f"cost table ({self.options.engine}, equal work): what half of each lever buys alone: {order}")
        if self.options.shape is not None:
            given = self.shape_point()
            point, note = next((dict(p) for p in points if {k: v for k, v in p.items() if k in SHAPE_FIELDS} == given),
                               None), ""
            if point is None:  # an FFN share the table did not measure, or the encoder's depth (no row)
                point, priced = dict(given), {k: v for k, v in given.items() if k != "enc_layers"}
                if "enc_layers" in given:
                    note = ", the encoder's depth not counted (the cost table has no row for it)"
                try:
                    point["predicted_speedup"] = round(levers.predict(table, priced), 4)
                except ValueError:  # below the table's FFN rows: the FFN's share left out of the prediction
                    note += ", the FFN's share not counted (below the cost table's rows)"
                    point["predicted_speedup"] = round(levers.predict(
                        table, {k: v for k, v in priced.items() if k != "ffn_percent"}), 4)
            self.log(f"--shape {self.options.shape}: {shape_words(point)}, predicted "
                     f"{point['predicted_speedup']:.2f}x{note} (the target {self.options.speedup:g}x)")
            return [point]
        if self.options.speedup is not None:
            reach = shapes_reaching(points, self.options.speedup)
            if not reach:
                best = points[0]
                fields = {lever.field for lever in levers.LEVERS if lever.removable}
                levers.refuse_unreachable(self.options.speedup,
                                          ({k: v for k, v in best.items() if k in fields},
                                           best["predicted_speedup"]), table, self.options.engine)
            how = ("as they are" if reach[0]["predicted_speedup"] >= self.options.speedup else
                   "with half of every FFN, none as it is")
            self.log(f"{len(reach)} per-stack shapes (at every decoder depth) reach {self.options.speedup:g}x {how} "
                     f"(predicted): fastest {shape_words(points[0])} {points[0]['predicted_speedup']:.2f}x")
            return reach
        return points

    def shape_point(self) -> Dict[str, int]:
        """--shape as a choice point {enc_heads, dec_heads[, dec_layers][, ffn_percent][, enc_layers]}, or one line
        where this model cannot take it (a stack's heads or layers out of range, nothing removed)."""
        shape, model = self.options.given_shape(), self.loaded.model
        shape.check(model, "--shape")
        whole = levers.stack_sizes(model)
        point = {"enc_heads": shape.enc_heads, "dec_heads": shape.dec_heads}
        if shape.dec_layers not in (None, whole["dec_layers"]):
            point["dec_layers"] = shape.dec_layers
        if shape.enc_layers not in (None, len(model.encoder.layers)):
            point["enc_layers"] = shape.enc_layers
        if shape.ffn_percent < 100:
            point["ffn_percent"] = shape.ffn_percent
        if point == {"enc_heads": whole["enc_heads"], "dec_heads": whole["dec_heads"]}:
            raise UserError(f"--shape {self.options.shape} is the unpruned model's: nothing to remove")
        return point

    # choice

    def _choice_identity(self, points: List[Dict]) -> Dict:
        o = self.options
        identity = {"target": o.target, "points": points, "calibration": [o.calibration_subset,
                    o.calibration_sentences, o.calibration_max_tokens, {"seed": o.sample_seed}],
                    "data": self._data_sha(o.calibration_subset)}
        if o.max_bleu_loss is not None:
            identity.update(heldout=o.heldout_sentences, shrink=self._shrink_settings(), valid=self._data_sha("valid"))
        return identity

    def _data_sha(self, subset: str) -> str:
        return calibration_files_sha256(self.loaded, subset)

    def _references_sha(self, subset: Optional[str] = None, references: Optional[str] = None) -> Optional[str]:
        if subset is None:
            subset, references = self.options.gen_subset, self.options.references
        return file_sha256(references) if references else self._data_sha(subset)

    def _also(self) -> List[Tuple[str, Optional[str]]]:
        """(subset, references or None) of each --also-report set."""
        o = self.options
        return list(zip(o.also_report, o.also_references or [None] * len(o.also_report)))

    def _gradients(self):
        with max_tokens(self.loaded, self.options.calibration_max_tokens):
            calibration = calibrate(self.loaded, calibration_only_options(self.options))
        pad = self.loaded.task.target_dictionary.pad()
        return select.sentence_gradients(self.loaded.model, calibration.samples, pad), calibration

    def _choice(self, folder: str, points: List[Dict]) -> Dict:
        grads, calibration = self._gradients()
        provenance = {**calibration.provenance(), "data": os.path.abspath(self.loaded.cfg.task.data)}
        if self.options.speedup is None:  # the Fisher frontier compares heads only: depth and FFN points left out
            scored = fisher_choice(self.loaded.model, grads, [p for p in points
                                                              if "dec_layers" not in p and "ffn_percent" not in p])
            return {**self._choice_by_bleu(folder, scored, provenance),
                    "levers": moved_levers(scored, levers.stack_sizes(self.loaded.model))}
        scored, layer_order = self._scored_by_depth(grads, calibration, points)
        best, confirmed, timed = self._confirmed(scored, calibration)
        depths = len({p.get("dec_layers") for p in scored})
        rule = (f"given by --shape {self.options.shape} (its heads by the Fisher estimate in the kept layers, its "
                "layers by the calibration loss)" if self.options.shape is not None else
                f"of the shapes predicted to reach {self.options.speedup:g}x (as they are; with half of every FFN "
                f"when none does), {len(scored)} at {depths} decoder depth(s), the first "
                f"{min(TIMED_AGAIN, len(scored))} in the choice's order (the lowest Fisher estimate of the loss "
                "increase within a depth, removing no more than another one first"
                + ("" if depths == 1 else ", the depths by the calibration NLL of their best shape")
                + ") and the fastest timed again as crude slices (then the FFN variant of each that measured below "
                "the target, and at a depth where every timed shape missed it, the next whose prediction scaled by "
                "the depth's measured/predicted ratio reaches it); of those that measured the target (clearing it "
                "by 3% when any does), the lowest calibration NLL after shrink's closed-form fits (layers removed, "
                "heads masked, FFN units removed, every changed sublayer refit; no window fit)")
        self.log(f"choice: {shape_words(best)}, {best['measured_speedup']:.2f}x measured (predicted "
                 f"{best['predicted_speedup']:.2f}x): {rule}"
                 + ("" if confirmed else "; it measured below the target" if self.options.shape is not None
                    else "; none of them measured it: the fastest of them")
                 + f" ({calibration.sentences} sentences of '{calibration.subset}')")
        return {"chosen": best, "candidates": scored, "timed": timed, "confirmed": confirmed,
                "levers": moved_levers(scored + timed, levers.stack_sizes(self.loaded.model)),
                "layer_order": layer_order,
                "chosen_by": rule if confirmed or self.options.shape is not None
                else "none of the shapes timed again measured the target: the fastest of them",
                "calibration": provenance}

    def _scored_by_depth(self, grads, calibration, points: List[Dict]) -> Tuple[List[Dict], Optional[Dict]]:
        """fisher_choice at each decoder depth among the points: on the model with the layers shrink's importance
        selection removes (one greedy run down to the shallowest depth, on the same calibration sentences: its
        order gives every depth's layers) and that model's own head-mask gradients (as shrink's head search in
        the kept layers). Each point gets its depth's `depth_nll` (when several depths compete): the calibration
        NLL of the depth's lowest-Fisher shape with its layers removed and its heads masked. Returns the scored
        points and the greedy layer order (None without a depth cut)."""
        model, pad = self.loaded.model, self.loaded.task.target_dictionary.pad()
        whole = levers.stack_sizes(model)
        full = whole["dec_layers"]
        groups: Dict[int, List[Dict]] = {}
        for p in points:
            groups.setdefault(p.get("dec_layers", full), []).append(p)
        order, kept = None, {}
        enc = {p["enc_layers"] for p in points if "enc_layers" in p}  # --shape only: one shape
        if enc:
            counts = layers.parse_keep_layers(keep_layers_spec(min(groups) if min(groups) < full else None, *enc))
            chosen = layers.select_by_loss(model, counts,
                                           lambda m: layers.calibration_loss(m, calibration.samples, pad), self.log)
            order, kept = chosen.as_json(), {min(groups): {s: list(v) for s, v in chosen.kept.items()}}
        elif min(groups) < full:
            chosen = layers.select_by_loss(model, {"dec": min(groups)},
                                           lambda m: layers.calibration_loss(m, calibration.samples, pad), self.log)
            order = chosen.as_json()
            kept = {d: {"dec": v} for d, v in kept_by_depth(chosen.steps, full, [d for d in groups if d < full]
                                                            ).items()}
        scored = []
        for depth in sorted(groups, reverse=True):
            cut = remove_layers(copy.deepcopy(model), kept[depth]) if depth in kept else model
            removes = any(p["enc_heads"] < whole["enc_heads"] or p["dec_heads"] < whole["dec_heads"]
                          for p in groups[depth])
            own = grads if cut is model else (select.sentence_gradients(cut, calibration.samples, pad)
                                              if removes else {})
            out = fisher_choice(cut, own, groups[depth])
            if depth in kept:
                for p in out:
                    p["layers_kept"] = kept[depth]
            if len(groups) > 1:
                best = candidate_order(out)[0]
                nll = masked_nll(cut, best["heads"], calibration.samples, pad)
                self.log(f"choice: at {depth} decoder layers, {label(best)} has the lowest Fisher estimate of "
                         f"{len(out)} shapes: calibration NLL {nll:.4f}")
                for p in out:
                    p["depth_nll"] = nll
            scored += out
        return scored, order

    def _confirmed(self, scored: List[Dict], calibration, tries: int = TIMED_AGAIN) -> Tuple[Dict, bool, List[Dict]]:
        """The candidates in the choice's order (candidate_order: the Fisher estimate within a depth, a shape that
        removes more than another candidate after it), the first `tries` (and the fastest predicted) timed again as
        crude slices in one interleaved run, each as it is or, when only its FFN variant is predicted to reach the
        target, as that; then, in at most RETIMED_ROUNDS more runs, the FFN variant of each shape that measured
        below it (ffn_variants) and, for depths where every timed shape missed it, the next shapes
        retime_candidates names. Of those that measure the target, the lowest calibration NLL after shrink's
        closed-form fits (reconstructed_nll: comparable across depths, head counts and FFN widths, where the Fisher
        estimates of different cut models are not); none measuring it, the fastest timed."""
        target = self.options.speedup
        if self.options.shape is not None:  # the shape given, timed as it is
            batch = list(scored)
        else:
            batch = [as_timed(p, target) for p in candidate_order(scored)[:tries]]
            fastest = as_timed(max(scored, key=lambda p: max(p["predicted_speedup"],
                                                             p.get("ffn_predicted_speedup", 0))), target)
            if fastest not in batch:
                batch.append(fastest)
        timed: List[Dict] = []
        for _ in range(1 + RETIMED_ROUNDS):
            shapes = {label(p): levers.ceiling_shape(self.loaded.model, p) for p in batch}
            measured = levers.time_shapes(self.loaded, self.options.engine, self.timing, self.rounds, shapes,
                                          self.log)
            for p in batch:
                p["measured_speedup"] = measured["speedup"][label(p)]
                p["timing_load"] = measured["load_average"]
            if (measured["load_average"] or 0.0) > levers.LOADED:
                self.log(f"choice: timed under a 1-minute load average of {measured['load_average']:.1f} (another "
                         "CPU-bound process beside the timing): slices time lower under load, and the shape taken "
                         "can move with it (docs/compress.md, Limits); a quiet machine gives the choice its figures")
            timed += batch
            if self.options.shape is not None:
                break
            seen = {label(p) for p in timed}
            batch = [p for p in ffn_variants(batch, target) + retime_candidates(scored, timed, target)
                     if label(p) not in seen]
            if not batch:
                break
        pad = self.loaded.task.target_dictionary.pad()
        best, confirmed = pick_measured(timed, self.options.speedup,
                                        lambda p: self.nll_after_fits(p, calibration, pad))
        self.log("choice: timed again " + ", ".join(
            f"{label(p)} {p['measured_speedup']:.2f}x" + (f" (calibration NLL after the closed-form fits "
                                                          f"{p['calibration_nll']:.4f})"
                                                          if "calibration_nll" in p else "") for p in timed))
        return best, confirmed, timed

    def nll_after_fits(self, point: Dict, calibration, pad: int) -> float:
        """A shape's calibration NLL after shrink's closed-form fits (choice.reconstructed_nll) with this run's
        shrink options: what the pick compares (benchmarks/nll_vs_recovery.py reads it too)."""
        options = with_fit(shrink_options(self.options, point["heads"], point.get("dec_layers"),
                                          point.get("ffn_percent", 100.0), point.get("enc_layers")),
                           window=WindowOptions(steps=0))
        return reconstructed_nll(self.loaded.model, point, calibration, options, pad)

    def _choice_by_bleu(self, folder: str, scored: List[Dict], provenance: Dict) -> Dict:
        """The fastest shape on the (speed, Fisher estimate) frontier whose shrunk model (before recovery) loses at
        most --max-bleu-loss BLEU on the held-out split of valid, in the engine: a bisection along the frontier
        (the loss falls as the shapes get slower), each probe a shrink with the full recipe and one decode."""
        o = self.options
        data, split = split_valid(self.loaded, os.path.join(folder, "data"), o.heldout_sentences)
        self.log(f"choice: valid split in two: sentences {split['heldout'][0]}-{split['heldout'][1] - 1} choose "
                 f"(subset '{HELDOUT}'), {split['valid'][0]}-{split['valid'][1] - 1} early-stop the recovery")
        frontier = fisher_frontier(scored)
        base = self._heldout_bleu(data, self.loaded.checkpoint, os.path.join(folder, "unpruned"))
        probes: Dict[str, Dict] = {}

        def loss(i: int) -> float:
            point = frontier[i]
            name = label(point).replace("/", "-")
            if name not in probes:
                cand = os.path.join(folder, "candidates", name)
                os.makedirs(cand, exist_ok=True)
                shrunk = self._shrink_heads(cand, point["heads"])
                bleu = self._heldout_bleu(data, shrunk["checkpoint"], os.path.join(cand, "decode"))
                probes[name] = {**point, "heldout_bleu": bleu, "heldout_loss": round(base - bleu, 2),
                                "shrunk": shrunk}
                self.log(f"choice: {label(point)} (predicted {point['predicted_speedup']:.2f}x) loses "
                         f"{base - bleu:.2f} BLEU on '{HELDOUT}' before recovery")
            return probes[name]["heldout_loss"]

        lo, hi = 0, len(frontier) - 1  # the first (fastest) index within the bound; the loss falls with the index
        if loss(hi) > o.max_bleu_loss:
            raise UserError(f"--max-bleu-loss {o.max_bleu_loss:g}: even the mildest shape, {label(frontier[hi])}, "
                            f"loses {probes[label(frontier[hi]).replace('/', '-')]['heldout_loss']:.2f} BLEU on the "
                            "held-out split before recovery; give a larger bound, or --speedup")
        while lo < hi:
            mid = (lo + hi) // 2
            if loss(mid) <= o.max_bleu_loss:
                hi = mid
            else:
                lo = mid + 1
        best = probes[label(frontier[lo]).replace("/", "-")]
        self.log(f"choice: {shape_words(best)}, predicted "
                 f"{best['predicted_speedup']:.2f}x, "
                 f"the fastest of {len(frontier)} frontier shapes within {o.max_bleu_loss:g} BLEU on '{HELDOUT}' "
                 f"({len(probes)} shrunk and decoded)")
        return {"chosen": best, "candidates": scored, "frontier": frontier, "probes": list(probes.values()),
                "heldout_bleu_unpruned": base, "split": split, "data": data,
                "chosen_by": f"the fastest shape of the frontier (predicted speed against the Fisher estimate) whose "
                             f"shrunk model, before recovery, loses at most {o.max_bleu_loss:g} BLEU in {o.engine} on "
                             f"valid sentences {split['heldout'][0]}-{split['heldout'][1] - 1} (held out of the "
                             "recovery's early stopping)",
                "calibration": provenance}

    def _heldout_bleu(self, data: str, checkpoint: str, folder: str) -> float:
        """BLEU of a checkpoint on the held-out split, decoded in the engine (references: the binarised targets)."""
        import torch

        cfg = copy.deepcopy(self.loaded.cfg)
        cfg.task.data, cfg.common_eval.path = data, checkpoint
        loaded = load(cfg)
        evaluator = SubsetEvaluator(loaded, HELDOUT)
        os.makedirs(folder, exist_ok=True)
        hyps = levers.EngineModel(loaded, self.options.engine, folder=os.path.join(folder, "model")).run(
            evaluator.samples)["hypotheses"]
        texts = [evaluator.hypothesis_text({"tokens": torch.tensor(hyps[i], dtype=torch.long)})
                 for i in range(evaluator.size)]
        shutil.rmtree(os.path.join(folder, "model"), ignore_errors=True)
        return round(float(evaluator.bleu(texts).score), 2)

    # shrink

    def _shrink_settings(self) -> Dict:
        o = self.options
        return {"calibration": [o.calibration_subset, o.calibration_sentences, o.calibration_max_tokens,
                                {"seed": o.sample_seed}],
                "window": [o.window_steps, o.window_lr], "check_sentences": o.check_sentences,
                "data": self._data_sha(o.calibration_subset)}

    def _shrink_identity(self, choice: Dict) -> Dict:
        chosen = choice["chosen"]
        return {**self._shrink_settings(), "heads": chosen["heads"],
                **({"layers_kept": chosen["layers_kept"]} if chosen.get("layers_kept") else {}),
                **({"ffn_percent": chosen["ffn_percent"]} if "ffn_percent" in chosen else {})}

    def _shrink(self, folder: str, choice: Dict) -> Dict:
        probe = choice["chosen"].get("shrunk")
        if probe and os.path.exists(probe["checkpoint"]):  # the choice shrank these heads with these options

            if file_sha256(probe["checkpoint"]) == probe["checkpoint_sha256"]:
                path = os.path.join(folder, "model.pt")
                shutil.copyfile(probe["checkpoint"], path)
                shutil.copyfile(os.path.splitext(probe["checkpoint"])[0] + ".json", os.path.join(folder, "model.json"))
                self.log("shrink: the choice's shrink of these heads, reused")
                return {**probe, "checkpoint": path}
        chosen = choice["chosen"]
        return self._shrink_heads(folder, chosen["heads"], chosen.get("layers_kept"),
                                  chosen.get("ffn_percent", 100.0))

    def _shrink_heads(self, folder: str, heads: str, layers_kept: Optional[Dict] = None,
                      ffn_percent: float = 100.0) -> Dict:
        """shrink with these heads removed (and these layers kept: shrink's importance selection, checked to keep
        the very layers the choice recorded, the heads naming them renumbered 1..N; and every FFN at this share of
        its units)."""
        kept = {s: len(v) for s, v in (layers_kept or {}).items()}
        opts = shrink_options(self.options, heads, kept.get("dec"), ffn_percent, kept.get("enc"))
        path = os.path.join(folder, "model.pt")
        with max_tokens(self.loaded, self.options.calibration_max_tokens), \
                open(os.path.join(folder, "shrink.log"), "a", encoding="utf-8") as log_file:
            def log(line: str) -> None:  # every sublayer's fit, in the stage's own log
                log_file.write(line + "\n")
                log_file.flush()

            result, calibration = shrink(self.loaded, opts, log)
            if layers_kept and {s: list(v) for s, v in result.layers.kept.items()} != layers_kept:
                raise RuntimeError(f"shrink kept the layers {dict(result.layers.kept)}, the choice {layers_kept}: "
                                   "the layer selection differs on the same sentences")
            record = write_checkpoint(self.loaded, result, calibration, opts, path, os.path.join(folder, "model.json"),
                                      log)
        set_head_masks(self.loaded.model, [])

        return {"checkpoint": path, "checkpoint_sha256": file_sha256(path), "heads_kept": record["heads_kept"],
                "heads_total": record["heads_total"], "params_before": record["params_before"],
                "params_after": record["params_after"], "calibration": record["calibration"],
                "layers": record["layers"], "shrink_options": record["options"]}

    # recover

    def _recover_key(self, shrunk_sha: str, sample: Dict) -> Dict:
        """What makes two recoveries the same run (their resume key): student, teacher, options, the recovery set."""
        o = self.options
        key = {"student": shrunk_sha, "teacher": file_sha256(self.loaded.checkpoint),
               "recover_args": list(o.recover_args)}
        if o.distill_hidden_weight:  # (absent when off: the records of runs before the option still resume)
            key["distill_hidden_weight"] = o.distill_hidden_weight
        if o.distill != "logits":  # (likewise)
            key["distill"] = o.distill
        if o.distill_source:  # (likewise)
            key["distill_source"] = [file_sha256(p) for p in o.distill_source]
            key["distill_nbest"] = o.distill_nbest
        if o.train_options:  # (likewise)
            key["train_options"] = list(o.train_options)
        if sample.get("sampled"):  # (likewise: all of train, as before the option)
            key["sample"] = {"sentences": o.recover_sentences, "seed": o.sample_seed}
        return key

    def _recover_stage(self, shrunk: Dict) -> Dict:
        o = self.options
        if o.recovered:
            inside = os.path.realpath(self.store.folder("recover")) + os.sep
            if os.path.realpath(o.recovered).startswith(inside):
                raise UserError(f"--recovered {o.recovered} is inside the recover stage's own folder, which the stage "
                                "replaces: move it out first")
            return self.stage("recover", {"recovered": file_sha256(o.recovered)},
                              lambda folder: self._adopt(folder, shrunk), 0.0)
        data, sample = self._recovery_set(prepare=o.budget_epochs > 0)
        key = self._recover_key(shrunk["checkpoint_sha256"], sample)
        record = self.store.record("recover")
        if record and record["identity"].get("run") == key:
            for name, flag in (("budget_epochs", "--budget-epochs"), ("budget_updates", "--budget-updates")):
                held = record["result"].get(name)
                if held is not None and held > getattr(o, name):
                    raise UserError(f"{self.store.folder('recover')} holds a recovery of {flag} {held}: give {flag} "
                                    f"{held} or more, or another --out")
        return self.stage("recover", {"run": key, "budget_epochs": o.budget_epochs,
                                      "budget_updates": o.budget_updates},
                          lambda folder: self._recover(folder, shrunk, data, sample), self.todo["recover"],
                          resume_key=key)

    def _recovery_set(self, prepare: bool = True) -> Tuple[str, Dict]:
        """The recovery's data folder and what it trains on: the user's (or the choice's, valid split) when train
        holds at most --recover-sentences pairs, else a folder whose train subset is a random sample of that many
        (OUT/stages/recover-data, drawn once per data, size and seed; `prepare` False: its path only)."""
        o = self.options
        base = (self.results.get("choice") or {}).get("data") or self.loaded.cfg.task.data
        train_subset, _, _ = split_subsets(o.train_options)
        total, _ = subset_tokens(self.loaded, train_subset)
        if o.recover_sentences >= total:
            return base, {"subset": train_subset, "sentences": total, "of": total, "sampled": False}
        folder = os.path.join(self.store.root, "recover-data")
        described = {"subset": train_subset, "sentences": o.recover_sentences, "of": total, "sampled": True,
                     "seed": o.sample_seed}
        if not prepare:
            return folder, described
        identity = {"data": recover.data_fingerprint(base, [train_subset]), "sentences": o.recover_sentences,
                    "seed": o.sample_seed, "subset": train_subset}
        held = read_json(os.path.join(folder, "sample.json"))
        if not held or held.get("identity") != identity:
            drawn = recover.sample_subset(base, train_subset, o.recover_sentences, o.sample_seed, folder)
            write_json_atomic(os.path.join(folder, "sample.json"), {"identity": identity, "drawn": drawn})
            self.log(f"recovery set: {o.recover_sentences} of the {total} pairs of '{train_subset}', drawn at random "
                     f"(seed {o.sample_seed}) into {folder}")
        return folder, described

    def _recover_options(self, out: str, work_dir: Optional[str], layers: Optional[Dict] = None):
        """`layers`: the shrink record's; a cut decoder compares each kept layer with the teacher layer its
        reconstruction aimed at (`teacher_outputs`), an uncut one layer by layer."""
        cfg = self.loaded.cfg
        languages = task_language_args(cfg.task)
        hidden_map = ((layers or {}).get("teacher_outputs") or {}).get("dec")
        train_subset, valid_subset, train_options = split_subsets(self.options.train_options)
        return RecoverOptions(teacher=self.loaded.checkpoint, out=out, epochs=self.options.budget_epochs,
                              updates=self.options.budget_updates, distill=self.options.distill,
                              distill_hidden_weight=self.options.distill_hidden_weight,
                              distill_hidden_layers=",".join(map(str, hidden_map)) if hidden_map and
                              self.options.distill_hidden_weight else "",
                              distill_source=list(self.options.distill_source),
                              distill_nbest=self.options.distill_nbest, train_subset=train_subset,
                              valid_subset=valid_subset, work_dir=work_dir,
                              train_args=languages + (encoder_args(cfg) if self.options.distill_source else [])
                              + train_options + list(self.options.recover_args))

    def recovery_command(self, data: str, layers: Optional[Dict] = None, elsewhere: bool = False) -> str:
        """The recovery's fairseq-train command, as the recover stage runs it (from OUT/stages/shrink's student into
        OUT/stages/recover/run); `elsewhere`: into OUT/recovery-run instead, to run on GPUs or a cluster (torchrun,
        Slurm) and hand back with --recovered (the recover stage's folder is its own)."""
        folder = self.store.folder("recover")
        work_dir = os.path.join(self.options.out, "recovery-run") if elsewhere else os.path.join(folder, "run")
        options = self._recover_options(os.path.join(folder, "model.pt"), work_dir, layers)
        model_cfg = self.loaded.saved_cfg.model
        arch = (model_cfg.get("arch") if hasattr(model_cfg, "get") else getattr(model_cfg, "arch", None)) \
            or "transformer"
        student = os.path.join(self.store.folder("shrink"), "model.pt")
        task = recover.saved_task_name(self.loaded.saved_cfg)
        if os.path.exists(student):  # the student's own model and task options (its pruned heads, its shape)
            student_cfg = recover._saved_cfg(recover._load_state(student), student)
            arch = recover._field(student_cfg["model"], "arch") or arch
            saved = recover.student_args(student, arch, task)
        else:  # --dry-run: the student does not exist yet
            saved = []
        argv = recover.training_argv(os.path.abspath(data), student, options, task, arch, saved)
        return "fairseq-train " + shlex.join(argv) + ("" if saved else "  (and the student's model options, read "
                                                      "from its checkpoint once the shrink wrote it)")

    def _write_recovery_script(self, shrunk: Dict) -> None:
        """--stop-after shrink: the recovery's fairseq-train command printed and written to OUT/recovery-run.sh
        (options given to the script are added to it: --distributed-world-size N, ...), to run here or elsewhere;
        --recovered then takes its best checkpoint."""
        data, _ = self._recovery_set()
        command = self.recovery_command(data, shrunk.get("layers"), elsewhere=True)
        script = os.path.join(self.options.out, "recovery-run.sh")
        with atomic_output(script) as f:
            f.write("#!/bin/sh\n# the recovery of compress, as its recover stage would run it; \"$@\": more "
                    "fairseq-train options\n" + f"exec {command} \"$@\"\n")
        os.chmod(script, 0o755)
        best = os.path.join(self.options.out, "recovery-run", "checkpoint_best.pt")
        self.log(f"the recovery, to run here or elsewhere (GPUs: --distributed-world-size N; a cluster: its "
                 f"fairseq-train under torchrun or srun), written to {script}:\n  {command}\nthen the same compress "
                 f"command with --recovered {best} goes on from its result")

    def _recover(self, folder: str, shrunk: Dict, data: str, sample: Dict) -> Dict:
        o = self.options
        if o.budget_epochs == 0:
            return {"checkpoint": shrunk["checkpoint"], "checkpoint_sha256": shrunk["checkpoint_sha256"],
                    "budget_epochs": 0, "recovered": False}
        out = os.path.join(folder, "model.pt")
        for path in (out, recover.record_path(out)):  # a shorter run's result: recovery goes on from its checkpoints
            if os.path.exists(path):
                os.remove(path)
        options = self._recover_options(out, os.path.join(folder, "run"), shrunk.get("layers"))
        with torch_threads(self.threads):  # the threads the command was given (every other stage times on one)
            record = recover.recover(data, shrunk["checkpoint"], options, log=self.log)
        return {"checkpoint": out, "checkpoint_sha256": file_sha256(out), "budget_epochs": o.budget_epochs,
                "budget_updates": o.budget_updates, "recovered": True, "updates": record["updates"],
                "updates_at_best": record["updates_at_best"], "sentences": sample["sentences"], "sample": sample,
                "processes": record["processes"], "device": record["device"], "threads": self.threads,
                "epochs": record["epochs"], "best_checkpoint": record["best_checkpoint"],
                "peak_rss_gib": record["peak_rss_gib"], "distill": options.distill,
                "distill_hidden": {"weight": options.distill_hidden_weight,
                                   "teacher_layers": options.distill_hidden_layers or "one to one"}
                if options.distill_hidden_weight else None}

    def _adopt(self, folder: str, shrunk: Dict) -> Dict:
        """--recovered CKPT: a recovery that ran elsewhere, checked to be a student of this run's shrink (every
        parameter's name and shape, and, where the file it was fine-tuned from is here, that file), written as
        the recovered model (weights and config, no optimizer state)."""
        import torch

        path = self.options.recovered
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
            raise UserError(f"--recovered: cannot load {path}: {type(e).__name__}") from None
        student = torch.load(shrunk["checkpoint"], map_location="cpu", weights_only=False)["model"]
        weights = state.get("model") or {}
        shapes = {k: tuple(v.shape) for k, v in weights.items() if torch.is_tensor(v)}
        wanted = {k: tuple(v.shape) for k, v in student.items() if torch.is_tensor(v)}
        differs = sorted(set(shapes) ^ set(wanted)) or sorted(k for k in wanted if shapes[k] != wanted[k])
        if differs:
            raise UserError(f"--recovered {path} is not a student of this run's shrink ({shrunk['checkpoint']}): "
                            f"{differs[0]} differs")
        cfg = state.get("cfg") or {}
        source = ((cfg.get("checkpoint") or {}).get("finetune_from_model")) if hasattr(cfg, "get") else None
        if source and os.path.isfile(source) and file_sha256(source) != shrunk["checkpoint_sha256"]:
            raise UserError(f"--recovered {path} was fine-tuned from {source}, not from this run's shrink")
        state.pop("last_optimizer_state", None)
        out = os.path.join(folder, "model.pt")
        save_state(state, out + ".tmp")
        os.replace(out + ".tmp", out)
        trained = (state.get("optimizer_history") or [{}])[-1]
        distributed = (cfg.get("distributed_training") or {}) if hasattr(cfg, "get") else {}
        _, sample = self._recovery_set(prepare=False)
        return {"checkpoint": out, "checkpoint_sha256": file_sha256(out), "budget_epochs": self.options.budget_epochs,
                "recovered": True, "elsewhere": os.path.abspath(path), "updates": trained.get("num_updates"),
                "updates_at_best": trained.get("num_updates"), "sentences": sample["sentences"], "sample": sample,
                "processes": int(distributed.get("distributed_world_size") or 1),
                "device": "elsewhere", "epochs": [], "best_checkpoint": os.path.basename(path),
                "distill": self.options.distill, "distill_hidden": None}

    # export

    def _load(self, path: str):
        return load_other(self.loaded, path)

    def _export(self, folder: str, recovered: Dict) -> Dict:
        if self.options.engine == "fairseq":
            return {"engine": "fairseq", "ct2": None}

        pruned = self._load(recovered["checkpoint"])
        evaluator = SubsetEvaluator(pruned, self.options.timing_subset)
        out = os.path.join(folder, "ct2")
        info = export(pruned, evaluator, ExportOptions(out=out, quantization=levers.QUANTIZATION[self.options.engine],
                                                       check_sentences=self.options.check_sentences,
                                                       vocab_map=self.options.vocab_map,
                                                       vocab_map_options=self.options.vocab_map_options),
                      self.options.timing_subset)
        return {"engine": self.options.engine, "ct2": out, "check": info}

    # measure

    def _engine_model(self, loaded, exported: Optional[Dict], tmp: str, name: str) -> levers.EngineModel:
        if exported and exported.get("ct2"):
            return levers.EngineModel(loaded, self.options.engine, ct2_folder=exported["ct2"])
        return levers.EngineModel(loaded, self.options.engine, folder=os.path.join(tmp, name))

    def _measure(self, folder: str, recovered: Dict, exported: Dict, timing) -> Dict:
        pruned = self._load(recovered["checkpoint"])
        with tempfile.TemporaryDirectory(prefix="compress-measure-") as tmp:
            models = {"unpruned": self._engine_model(self.loaded, None, tmp, "unpruned"),
                      "compressed": self._engine_model(pruned, exported, tmp, "compressed")}
            natural = models["unpruned"].run(timing)
            length = max(1, round(statistics.mean(len(h) for h in natural["hypotheses"].values())))
            decoders = {k: m.run for k, m in models.items()}
            forced = levers.timed_rounds(decoders, timing, self.rounds, length)
            as_decoded = levers.timed_rounds(decoders, timing, self.rounds, 0)
            singles = single_sentences(self.loaded, self.options.timing_subset, self.options.latency_sentences)
            latency = levers.timed_rounds(decoders, singles, self.options.runs, length)
            load = levers.load_average()
        src = [int(n) for s in timing for n in s["net_input"]["src_lengths"].tolist()]
        beam, batch = int(self.loaded.cfg.generation.beam), max(s["id"].numel() for s in timing)
        shape_of = ModelShape.of if self.options.engine == "fairseq" else ct2_shape
        n = sum(s["id"].numel() for s in timing)
        return {"subset": self.options.timing_subset, "sentences": n, "runs": self.rounds, "batches": len(timing),
                "forced_length": length, "largest_batch": batch, "load_average": load,
                "speedup_equal_work": round(levers.paired_speedup(forced["unpruned"], forced["compressed"]), 3),
                "speedup_as_decoded": round(levers.paired_speedup(as_decoded["unpruned"], as_decoded["compressed"]),
                                            3),
                "speedup_equal_work_total": round(sum(forced["unpruned"]) / sum(forced["compressed"]), 3),
                "sentences_per_s": {k: round(n * self.rounds / sum(v), 1) for k, v in as_decoded.items()},
                "latency_batch1": {"sentences": len(singles), "forced_length": length,
                                   "ms": {k: round(1000 * statistics.median(v), 2) for k, v in latency.items()},
                                   "speedup": round(levers.paired_speedup(latency["unpruned"],
                                                                          latency["compressed"]), 3)},
                "flop_ratio": round(flops.flop_ratio(shape_of(self.loaded.model), shape_of(pruned.model), src,
                                                     [length + 1] * len(src), beam, batch), 4)}

    # report

    def _report(self, folder: str, recovered: Dict, exported: Dict) -> Dict:
        """--gen-subset and each --also-report set, decoded once by both models: the only reads of them."""
        o = self.options
        pruned = self._load(recovered["checkpoint"])
        with tempfile.TemporaryDirectory(prefix="compress-report-") as tmp:
            models = {"unpruned": self._engine_model(self.loaded, None, tmp, "unpruned"),
                      "compressed": self._engine_model(pruned, exported, tmp, "compressed")}
            main = scored_pair(self.loaded, models, folder, o.gen_subset, o.references)
            also = [{**scored_pair(self.loaded, models, folder, subset, references),
                     "overlap": self._overlap(subset)} for subset, references in self._also()]
        heldout = None
        choice = self.results["choice"]
        if choice.get("data"):  # --max-bleu-loss: the held-out split the choice read, after recovery
            after = self._heldout_bleu(choice["data"], recovered["checkpoint"], os.path.join(folder, "heldout"))
            heldout = {"bleu_unpruned": choice["heldout_bleu_unpruned"], "bleu_compressed": after,
                       "loss": round(choice["heldout_bleu_unpruned"] - after, 2),
                       "loss_before_recovery": choice["chosen"]["heldout_loss"], "sentences": choice["split"]}
        return {**main, "heldout": heldout, "also": also, "engine": o.engine,
                "significance": f"paired bootstrap of sacreBLEU against the unpruned model in {o.engine} "
                                f"({BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}, one-sided)"}

    def _overlap(self, subset: str) -> Dict[str, int]:
        """How many of a reported set's source sentences also occur in each set a choice or training read (identical
        captions happen; a count near the set's size means it was not held out)."""
        def sources(name: str) -> set:
            dataset = load_subset(self.loaded, name)
            return {tuple(dataset[i]["source"].tolist()) for i in range(len(dataset))}

        mine = load_subset(self.loaded, subset)  # (the multilingual task's datasets have no .src)
        mine = [tuple(mine[i]["source"].tolist()) for i in range(len(mine))]
        overlap = {}
        for name in dict.fromkeys(("train", "valid", self.options.calibration_subset)):
            seen = sources(name)
            overlap[name] = sum(sentence in seen for sentence in mine)
        return overlap

    # outputs

    def _write_outputs(self, table, points, choice, shrunk, recovered, exported, measured, reported) -> Dict:
        o = self.options
        record = {"target": o.target, "engine": o.engine, "options": {k: (list(v) if isinstance(v, tuple) else v)
                                                                        for k, v in asdict(o).items()},
                  "source_checkpoint": os.path.abspath(self.loaded.checkpoint),
                  "data": os.path.abspath(self.loaded.cfg.task.data),
                  "stages": {name: self.results[name] for name in STAGES if name in self.results},
                  "reachable_shapes": points, "rates": self.rates, "estimated_cpu_seconds": self.plan,
                  "cpu_seconds": {name: self.results[name].get("cpu_seconds") for name in STAGES
                                  if name in self.results},
                  "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
                  "teacher_trained_on": list(o.teacher_trained_on)}
        record["verdict"] = verdict(record)
        preflight.output_folder(o.out)  # a file of the user's put there while the run went on stays untouched
        # paths as OUT/..., DATA/... or file names: the record and the card travel without this machine's folders
        record = model_card.portable(record, os.path.abspath(o.out), os.path.abspath(self.loaded.cfg.task.data))
        record_path = os.path.join(o.out, "compress.json")
        if os.path.exists(record_path):  # the outputs are a set only while compress.json is there: written last
            os.remove(record_path)
        model_path = os.path.join(o.out, "model.pt")
        staged = model_path + ".tmp"
        shutil.copyfile(recovered["checkpoint"], staged)
        os.replace(staged, model_path)
        card = model_card.render(record)
        if exported.get("ct2"):
            replace_folder(exported["ct2"], os.path.join(o.out, "ct2"))
            with atomic_output(os.path.join(o.out, "ct2", "MODEL_CARD.md")) as f:  # the card travels with ct2/
                f.write(card)
        with atomic_output(os.path.join(o.out, "MODEL_CARD.md")) as f:
            f.write(card)
        write_json_atomic(record_path, record)
        for line in record["verdict"]["lines"]:
            self.log(line)
        return record


def scored_pair(loaded, models: Dict, folder: Optional[str], subset: str, references: Optional[str]) -> Dict:
    """One set decoded by both models ({"unpruned": EngineModel, "compressed": EngineModel}) in their engine: BLEU of
    each, the difference and its paired-bootstrap p; the hypotheses written to folder as NAME.SUBSET.txt."""
    import torch

    evaluator = SubsetEvaluator(loaded, subset, references)
    texts = {}
    for name, model in models.items():
        hyps = model.run(evaluator.samples)["hypotheses"]
        texts[name] = [evaluator.hypothesis_text({"tokens": torch.tensor(hyps[i], dtype=torch.long)})
                       for i in range(evaluator.size)]
        if folder:
            with open(os.path.join(folder, f"{name}.{subset}.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(texts[name]) + "\n")
    bleu = {k: round(float(evaluator.bleu(v).score), 2) for k, v in texts.items()}
    p = BleuBootstrap(evaluator.references, texts["unpruned"], BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED).test(
        texts["compressed"]).p_value
    return {"subset": subset, "sentences": evaluator.size, "references": evaluator.reference_source,
            "bleu_unpruned": bleu["unpruned"], "bleu_compressed": bleu["compressed"],
            "bleu_delta": round(bleu["compressed"] - bleu["unpruned"], 2), "p": round(float(p), 4),
            "signature": evaluator.bleu_signature()}


def task_language_args(task_cfg) -> List[str]:
    """fairseq-train's options for the directions this run reads: -s/-t, and the multilingual task's --lang-pairs
    (a hydra task is a DictConfig, a legacy one such as the multilingual task's a Namespace)."""
    def get(key):
        return task_cfg.get(key) if hasattr(task_cfg, "get") else getattr(task_cfg, key, None)

    args = ["-s", get("source_lang"), "-t", get("target_lang")] if get("source_lang") else []
    pairs = get("lang_pairs")  # the multilingual task keeps it as a list once parsed
    return args + (["--lang-pairs", pairs if isinstance(pairs, str) else ",".join(pairs)] if pairs else [])


def single_sentences(loaded, subset: str, n: int):
    """The first n sentences of a subset (by id), one batch each: the latency at batch 1."""
    dataset = load_subset(loaded, subset)
    return [dataset.collater([dataset[i]]) for i in range(min(n, len(dataset)))]


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


def verdict(record: Dict) -> Dict:
    """Met or missed, by how much, and what the cost table says would reach a missed target."""
    stages = record["stages"]
    measured, reported, table = stages["measure"], stages["report"], stages["cost-table"]
    chosen = stages["choice"]["chosen"]
    speed, loss = measured["speedup_equal_work"], -reported["bleu_delta"]
    lines = [f"compressed model: {shape_words(chosen)}, {speed:.2f}x the unpruned model "
             f"in {record['engine']} at equal work ({measured['speedup_as_decoded']:.2f}x as decoded; FLOP ratio "
             f"{measured['flop_ratio']:.2f}); BLEU on {reported['subset']} {reported['bleu_compressed']:.2f} against "
             f"{reported['bleu_unpruned']:.2f} ({reported['bleu_delta']:+.2f}, p {reported['p']:.3f})"]
    trained = set(record.get("teacher_trained_on") or ())
    for also in reported.get("also") or []:
        where = ("the unpruned model's training data: not a held-out result" if also["subset"] in trained else
                 "no choice or training of this run read it")
        lines.append(f"BLEU on {also['subset']} ({where}): "
                     f"{also['bleu_compressed']:.2f} against {also['bleu_unpruned']:.2f} ({also['bleu_delta']:+.2f}, "
                     f"p {also['p']:.3f})")
    out = {"speedup": speed, "bleu_loss": round(loss, 2)}
    target = record["options"]["speedup"]
    if target is not None:
        met = speed >= target
        out["met"] = met
        bleu = (f"; BLEU {reported['bleu_delta']:+.2f} on {reported['subset']} (p {reported['p']:.3f}; "
                f"{'significant' if reported['p'] < 0.05 else 'not significant'} at 0.05; no BLEU bound was set)")
        if met:
            lines.append(f"target {target:g}x: speed met ({speed:.2f}x){bleu}")
        else:
            faster = [p for p in record["reachable_shapes"] if p["predicted_speedup"] > chosen["predicted_speedup"]]
            hint = (f"; the cost table predicts {shape_words(faster[-1])} at {faster[-1]['predicted_speedup']:.2f}x"
                    if faster else "")
            rerun = "" if record["options"].get("shape") else "; rerun with a higher --speedup to take it"
            lines.append(f"target {target:g}x: speed missed by {target - speed:.2f}x (predicted "
                         f"{chosen['predicted_speedup']:.2f}x{hint if rerun else ''}{rerun}){bleu}")
    else:
        bound, held = record["options"]["max_bleu_loss"], reported["heldout"]
        out["met"] = held["loss"] <= bound
        lines.append(f"target BLEU loss at most {bound:g} on held-out data: {'met' if out['met'] else 'missed'} "
                     f"({held['loss']:.2f} on valid's held-out split after recovery, "
                     f"{held['loss_before_recovery']:.2f} before; {loss:.2f} on {reported['subset']})")
    out["lines"] = lines
    out["lever_order"] = levers.lever_order(table)
    return out


def run(loaded, options: CompressOptions, log: Callable = print, progress: bool = True) -> Optional[Dict]:
    """The whole run under a lock on OUT (one process per folder)."""
    options.check()
    inputs = preflight.command_inputs(loaded.cfg.task.data, loaded.checkpoint,
                                      (options.references, *options.also_references))
    preflight.output_folder(options.out, inputs)
    compress = Run(loaded, options, log, progress)
    compress.check()
    if options.dry_run:  # the plan only: nothing is written, OUT not even made
        return compress.run()
    os.makedirs(options.out, exist_ok=True)
    with FolderLock(options.out, option="--out"):
        preflight.output_folder(options.out, inputs)  # as it is now that this process holds it
        return compress.run()


def encoder_args(cfg) -> List[str]:
    """The tokenizer and BPE options of a loaded config as command-line options (fairseq's own names), for a
    fairseq-train that must encode raw text as fairseq-generate would: interpolated values (the language pair)
    and false switches left to fairseq."""
    argv = []
    for kind in ("tokenizer", "bpe"):
        section = cfg.get(kind)
        if not section or not section.get("_name"):
            continue
        argv += [f"--{kind}", str(section["_name"])]
        for key in section:
            if key == "_name" or section._get_node(key)._is_interpolation():
                continue
            value = section[key]
            if value is None or value is False:
                continue
            argv += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return argv


def comma_list(text: str) -> Tuple[str, ...]:
    """fairseq's comma-separated list of subsets (as --valid-subset takes them)."""
    return tuple(part for part in text.split(",") if part)


def recover_args(text: Optional[str]) -> Tuple[str, ...]:
    return tuple(shlex.split(text)) if text else ()
