"""CompressOptions: what `fairseq-headprune compress` does, every field with the command's default and its flag
(cli.compress generates the parser from it), and the checks of the options alone, before anything loads."""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Optional, Tuple

from fairseq_headprune.prune import levers
from fairseq_headprune.prune.recovery_config import DistillationOptions, RecoverOptions
from fairseq_headprune.prune.vocab_map import VocabMapBound, VocabMapOptions
from fairseq_headprune.prune.vocabulary import VocabularyOptions
from fairseq_headprune.prune.window_fit import WindowOptions
from fairseq_headprune.core.shape import Shape
from fairseq_headprune.errors import UserError
from fairseq_headprune.options import given_flags, nested, non_finite, option

STAGES = ("cost-table", "choice", "shrink", "recover", "export", "measure", "report")
# the recovery's default budget: about the bundled De-En model's (4 epochs of its 28k pairs, 1008 updates of 2048
# tokens), whatever the corpus: a sample of 100k pairs, at most 1200 updates
BUDGET_UPDATES, RECOVER_SENTENCES = 1200, 100_000


@dataclass
class CompressOptions:
    """What `fairseq-headprune compress` does; every field has the command's default."""

    out: str = option(flag="--out", section="target",
                      metavar="DIR", help="the folder of the model, its card and its stages")
    speedup: Optional[float] = option(None, flag="--speedup", section="target",
                                      help="at least this many times the unpruned model's speed in --engine, at "
                                           "equal work")
    max_bleu_loss: Optional[float] = option(None, flag="--max-bleu-loss", section="target",
                                            help="instead: the fastest model that loses at most this much BLEU on a "
                                                 "held-out split of valid")
    max_chrf_loss: Optional[float] = option(None, flag="--max-chrf-loss", section="target",
                                            help="instead: the same bound in chrF points (sacreBLEU's chrF)")
    shape: Optional[str] = option(None, flag="--shape", section="target", metavar="[L x]ENC/[L x]DEC[:ffn=P%]",
                                  help="build this shape instead of choosing one (heads kept per layer of each "
                                       "stack, each stack's layers and the share of every FFN's units "
                                       "optionally: 8/3, 6x8/3x3, 4x8/3, 8/3:ffn=75%%, as deploy --ceilings); which "
                                       "heads, layers and units go is chosen as for the choice's own and shrink's")
    engine: str = option("ct2-int8", flag="--engine", section="target",
                         help=f"where the model runs: {', '.join(levers.ENGINES)}")
    deploy_batch: Optional[int] = option(None, flag="--deploy-batch", section="target", metavar="N",
                                         help="the batch the model is served at (1: one sentence at a time, "
                                              "interactive use): the cost table, the choice and the target time "
                                              "batches of N sentences (default: up to --batch-size, else 16)")
    deploy_threads: int = option(1, flag="--deploy-threads", section="target", metavar="T",
                                 help="the threads the served model decodes on: every timing uses T")
    budget_epochs: int = option(4, flag="--budget-epochs", section="recovery",
                                help="recovery epochs at most over the recovery set (early stopping on valid; a "
                                     "rerun with more extends; 0: no recovery)")
    budget_updates: int = option(BUDGET_UPDATES, flag="--budget-updates", section="recovery",
                                 help="recovery updates at most (fairseq-train's --max-update: the recovery stops at "
                                      "whichever of the two budgets comes first; a rerun with more extends). With "
                                      "--recover-sentences, the defaults hold a corpus of millions of pairs to the "
                                      "budget of a few epochs of a small corpus")
    recover_sentences: int = option(RECOVER_SENTENCES, flag="--recover-sentences", section="recovery",
                                    help="the recovery's training set: a random sample of this many pairs of train "
                                         "(seeded by --sample-seed, recorded; all of train when it holds fewer)")
    sample_seed: int = option(1, flag="--sample-seed", section="recovery",
                              help="seed of the random samples of train: the calibration sentences and the "
                                   "recovery set")
    gen_subset: str = "test"  # fairseq's --gen-subset: decoded once, at the end, to report
    references: Optional[str] = option(None, flag="--references", section="reported sets",
                                       help="raw references of --gen-subset for BLEU (default: the binarised targets)")
    also_report: Tuple[str, ...] = option((), flag="--also-report", section="reported sets",
                                          metavar="SUBSET[,SUBSET...]",
                                          parse=lambda text: comma_list(text),
                                          help="more sets decoded once, at the end, beside --gen-subset (a second "
                                               "test set): no choice or training of the run reads them")
    also_references: Tuple[str, ...] = option((), flag="--also-references", section="reported sets",
                                              metavar="FILE[,FILE...]",
                                              parse=lambda text: comma_list(text),
                                              help="their raw references, in the same order (default: the "
                                                   "binarised targets)")
    teacher_trained_on: Tuple[str, ...] = option((), flag="--teacher-trained-on", section="reported sets",
                                                 metavar="SUBSET[,SUBSET...]",
                                                 parse=lambda text: comma_list(text),
                                                 help="--also-report sets the unpruned model was trained on: the "
                                                      "card labels them as its training data, apart from the "
                                                      "held-out results")
    calibration_subset: str = option("train", flag="--calibration-subset", section="calibration and refit",
                                     help="sentences the heads are chosen and the model reconstructed on (never "
                                          "--gen-subset; shrink's default is valid, compress keeps valid held out "
                                          "for the recovery's early stopping)")
    calibration_sentences: int = option(1000, flag="--calibration-sentences", section="calibration and refit",
                                        help="how many of them, drawn at random over the subset (--sample-seed)")
    calibration_max_tokens: int = option(1000, flag="--calibration-max-tokens", section="calibration and refit",
                                         help="tokens per calibration batch")
    window: WindowOptions = nested(WindowOptions, section="calibration and refit", defaults={"steps": 1000},
                                   why="compress's, chosen on val in results/recover-de-en; shrink's 0 keeps a "
                                       "plain shrink fast")
    timing_subset: str = option("valid", flag="--timing-subset", section="timing and checks",
                                help="sentences the speeds are measured on")
    timing_sentences: int = option(300, flag="--timing-sentences", section="timing and checks", help="how many of them")
    runs: int = option(3, flag="--runs", section="timing and checks",
                       help="interleaved timing rounds, at least (more when the timing batches are too few for every "
                            "sign test to see 10 paired batches)")
    latency_sentences: int = option(50, flag="--latency-sentences", section="timing and checks",
                                    help="sentences of --timing-subset decoded one at a time, for the latency at "
                                         "batch 1")
    heldout_sentences: int = option(500, flag="--heldout-sentences", section="timing and checks",
                                    help="--max-bleu-loss: the first N sentences of valid choose; the rest early-stop "
                                         "the recovery")
    check_sentences: int = option(100, flag="--check-sentences", section="timing and checks",
                                  help="sentences of the pruned-model and export checks")
    significance: float = option(levers.SIGNIFICANCE, flag="--significance", section="timing and checks",
                                 help="a cost-table row's time saving counts when its slice was faster in "
                                      "significantly more batches than not: sign test p below this (1: every "
                                      "measured saving counts)")
    distillation: DistillationOptions = nested(DistillationOptions, section="recovery")  # recover's, the same
    vocab_map: bool = option(False, flag="--vocab-map", section="vocabulary", group="vocabulary map",
                             help="ct2 engines: ship a vocabulary map (vmap.txt, from the training pairs) the "
                                  "choice times its shapes with and the model is measured, checked and reported "
                                  "with: the output layer scores only the target words the batch's source words "
                                  "bring in (export-ct2 --vocab-map). Without it, --speedup weighs the map as a "
                                  "lever of the choice")
    no_vocab_map: bool = option(False, flag="--no-vocab-map", section="vocabulary", group="vocabulary map",
                                help="--speedup: never ship a vocabulary map (the choice does not weigh it)")
    vocab_map_options: VocabMapOptions = nested(VocabMapOptions, section="vocabulary")
    vocab_map_bound: VocabMapBound = nested(VocabMapBound, section="vocabulary")  # export-ct2's, the same
    # shrink's --keep-vocab: the model that ships (OUT/model.pt, ct2/) holds only these corpora's vocabulary, trimmed
    # after the recovery; the cost table times the output layer at the share it keeps, and every shape is
    # predicted and timed with it
    vocabulary: VocabularyOptions = nested(VocabularyOptions, section="vocabulary")
    recover_args: Tuple[str, ...] = option((), flag="--recover-args", section="recovery",
                                           metavar="'FAIRSEQ-TRAIN OPTIONS'",
                                           parse=lambda text: recover_args(text),
                                           help="fairseq-train options of the recovery, as one argument: "
                                                "--recover-args='--lr 3e-4' (device and distributed options too)")
    cost_cache: Optional[str] = option(None, flag="--cost-cache", section="the run",
                                       help="folder of cost tables measured before (per model, engine, CPU; default "
                                            "~/.cache/fairseq-headprune/cost-tables); '' for none")
    stop_after: Optional[str] = option(None, flag="--stop-after", section="the run", choices=STAGES,
                                       help="stop after this stage (the same command without it goes on); after "
                                            "shrink it prints the recovery's fairseq-train command, to run elsewhere "
                                            "(a GPU, a cluster) and continue with --recovered")
    recovered: Optional[str] = option(None, flag="--recovered", section="recovery", metavar="CKPT",
                                      help="a recovery run elsewhere (the checkpoint_best.pt of the fairseq-train "
                                           "command --stop-after shrink printed): checked to be a student of this "
                                           "run's shrink, then exported, measured and reported")
    dry_run: bool = option(False, flag="--dry-run", section="the run",
                           help="print the plan (the stages, the data each reads, the estimate of each, the "
                                "recovery's fairseq-train command) and exit, writing nothing")
    train_options: Tuple[str, ...] = ()  # fairseq-train options given to compress itself (cli.compress): to recovery
    command: str = ""  # the command line as given, for the model card

    def check(self) -> None:
        """Every option applied or refused in one line, before anything loads."""
        non_finite(self)
        self._check_target()
        self._check_counts()
        self._check_recovery()
        self._check_vocabulary()
        self._check_sets()
        self._check_out()
        self.vocabulary.check()

    def _check_target(self) -> None:
        """The target (--speedup or --max-bleu-loss) and --shape."""
        if [self.speedup, self.max_bleu_loss, self.max_chrf_loss].count(None) != 2:
            raise UserError("give exactly one target: --speedup X (times the unpruned model's speed), "
                            "--max-bleu-loss X or --max-chrf-loss X (BLEU or chrF points on held-out data)")
        if self.speedup is not None and not self.speedup > 1:
            raise UserError(f"--speedup must be above 1, not {self.speedup:g}")
        if self.quality_bound() is not None and self.quality_bound()[1] < 0:
            raise UserError(f"{self.target.split()[0]} must be at least 0, not {self.quality_bound()[1]:g}")
        if self.shape is not None:
            if self.quality_bound() is not None:
                raise UserError(f"--shape gives the shape {self.target.split()[0]} would choose: give --speedup X "
                                "(the speed it is judged against) with it")
            self.given_shape()

    def _check_counts(self) -> None:
        """--engine, the counts, --significance and the window fit's settings."""
        if self.engine not in levers.ENGINES:
            raise UserError(f"--engine must be one of {', '.join(levers.ENGINES)}, not {self.engine!r}")
        if self.deploy_batch is not None and self.deploy_batch < 1:
            raise UserError(f"--deploy-batch must be at least 1 sentence, not {self.deploy_batch}")
        if self.deploy_threads < 1 or self.deploy_threads > (os.cpu_count() or 1):
            raise UserError(f"--deploy-threads must be between 1 and this machine's {os.cpu_count() or 1} cores, "
                            f"not {self.deploy_threads}")
        for name in ("calibration_sentences", "calibration_max_tokens", "timing_sentences", "runs",
                     "check_sentences", "heldout_sentences", "latency_sentences", "budget_updates",
                     "recover_sentences"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(self, name)}")
        for flag, value in (("--budget-epochs", self.budget_epochs), ("--window-steps", self.window.steps)):
            if value < 0:
                raise UserError(f"{flag} must be at least 0, not {value}")
        if not 0 < self.significance <= 1:
            raise UserError(f"--significance must be in (0, 1], not {self.significance:g}")
        if self.window.lr <= 0:
            raise UserError(f"--window-lr must be above 0, not {self.window.lr:g}")
        if not self.window.steps and self.window.lr != WindowOptions.lr:
            raise UserError("--window-lr sets the window fit's learning rate: it needs --window-steps N (above 0)")

    def _check_recovery(self) -> None:
        """The recovery's signal and budget against each other, and --recovered."""
        self.distillation.check(RecoverOptions.sequence_beam, "the teacher's beam")  # recover's refusals, the same
        given = given_flags(DistillationOptions, self.distillation)
        if self.budget_epochs == 0 and given:
            flag, value = next(iter(given.items()))
            raise UserError(f"{flag}{f' {value}' if isinstance(value, str) else ''}: --budget-epochs 0 runs no "
                            "recovery")
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

    def _check_vocabulary(self) -> None:
        """--vocab-map and --keep-vocab against the engine and the target."""
        if self.vocabulary.corpora and self.engine == "fairseq":
            raise UserError("--keep-vocab: --engine fairseq times and scores the model on DATA's ids, which a trimmed "
                            "vocabulary renumbers; use a CTranslate2 engine, or trim OUT/model.pt after with shrink "
                            "--keep-vocab")
        if self.vocab_map and self.engine == "fairseq":
            raise UserError("--vocab-map is CTranslate2's (use_vmap): --engine fairseq cannot apply it")
        self.vocab_map_options.check(self.map_state() != "off")
        self.vocab_map_bound.check(self.map_state() != "off")

    def _check_sets(self) -> None:
        """The reported sets against the ones a choice or training reads, --stop-after, the references."""
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

    def _check_out(self) -> None:
        """--out: a folder whose path fairseq can read back."""
        if os.path.exists(self.out) and not os.path.isdir(self.out):
            raise UserError(f"--out {self.out} is a file; name a folder")
        if os.pathsep in os.path.abspath(self.out):  # found at the export of an 8-epoch run, after the training
            raise UserError(f"--out {self.out}: fairseq's --path splits a checkpoint path on '{os.pathsep}' (an "
                            f"ensemble), so the stages could not load the models written there; name a folder "
                            f"without it")

    def given_shape(self):
        """--shape as deploy's Shape: heads per stack, the decoder's depth, the FFNs' share of units."""
        shape = Shape.parse(self.shape, "--shape")
        if shape.vocab_percent < 100:
            raise UserError(f"--shape {self.shape}: the output layer is trimmed to a deployment's vocabulary by "
                            "--keep-vocab CORPUS..., not by a share (--shape sets heads per stack, the decoder's "
                            "depth and the FFN units)")
        return shape

    def map_state(self) -> str:
        """The vocabulary map in the choice's points (compress.choice.MAP_STATES): "on" with --vocab-map; "weighed"
        by --speedup's choice of its own shape in a CTranslate2 engine unless --no-vocab-map; "off" otherwise."""
        if self.vocab_map:
            return "on"
        if (self.speedup is not None and self.shape is None and self.engine != "fairseq"
                and not self.no_vocab_map):
            return "weighed"
        return "off"

    @property
    def target(self) -> str:
        if self.speedup is not None:
            return f"--speedup {self.speedup:g}"
        metric, bound = self.quality_bound()
        return f"--max-{metric.lower()}-loss {bound:g}"

    def quality_bound(self) -> Optional[Tuple[str, float]]:
        """("BLEU", X) for --max-bleu-loss X, ("chrF", X) for --max-chrf-loss X; None for --speedup."""
        if self.max_bleu_loss is not None:
            return "BLEU", self.max_bleu_loss
        if self.max_chrf_loss is not None:
            return "chrF", self.max_chrf_loss
        return None



def comma_list(text: str) -> Tuple[str, ...]:
    """fairseq's comma-separated list of subsets (as --valid-subset takes them)."""
    return tuple(part for part in text.split(",") if part)


def recover_args(text: Optional[str]) -> Tuple[str, ...]:
    return tuple(shlex.split(text)) if text else ()
