"""How sure shrink's target verdicts are: each pruned checkpoint against the unpruned model on test2016, by the paired
bootstrap (never in CI). For each: BLEU and its change, the 95% interval of the change over full-size resamples
(what another draw of a test set this size could give), and the one-sided p of the ordering with full-size and with
half-size resamples (compare-mt's default, the report's setting).

usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/shrink_significance.py CKPT... [--samples 1000] [--seed 1]
       (e.g. the checkpoints benchmarks/shrink_targets.py wrote: work/bench-shrink/shrink-30.pt ...)
"""
from __future__ import annotations

import argparse
import os

from shrink_targets import DATA, DECODING, MODEL, REFS, ROOT


def hypotheses_of(checkpoint: str):
    """(references, hypotheses, BLEU) of a checkpoint on test2016, decoded as every command here decodes."""
    from fairseq_headprune.cli import _quiet_dependencies, parse
    from fairseq_headprune.cli import shrink as command
    from fairseq_headprune.decoding.evaluate import SubsetEvaluator
    from fairseq_headprune.fairseq_io.loading import load, trust_fairseq_checkpoints

    trust_fairseq_checkpoints()
    _quiet_dependencies()
    cfg, _ = parse("shrink", command, [DATA, "--path", checkpoint, "--gen-subset", "test", *DECODING])
    evaluator = SubsetEvaluator(load(cfg), "test", REFS)
    hyps = evaluator.translate()
    return evaluator.references, hyps, evaluator.bleu(hyps).score


def main() -> None:
    from fairseq_headprune.stats import BleuBootstrap

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    checkpoints = [os.path.abspath(c) for c in args.checkpoints]
    os.chdir(ROOT)
    refs, base_hyps, base = hypotheses_of(MODEL)
    full = BleuBootstrap(refs, base_hyps, args.samples, args.seed, sample_ratio=1.0)
    half = BleuBootstrap(refs, base_hyps, args.samples, args.seed, sample_ratio=0.5)
    print(f"paired bootstrap against {MODEL} on test2016 ({len(refs)} sentences, beam 5): {args.samples} resamples, "
          f"seed {args.seed}; interval: 95%, full-size resamples; p: one-sided, full-size and half-size resamples")
    print("\n| checkpoint | BLEU | change | 95% interval of the change | p (full-size) | p (half-size) |")
    print("|---|---|---|---|---|---|")
    print(f"| {MODEL} | {base:.2f} | | | | |")
    for ckpt in checkpoints:
        _, hyps, bleu = hypotheses_of(ckpt)
        low, high = full.difference_interval(hyps)
        print(f"| {os.path.relpath(ckpt, ROOT)} | {bleu:.2f} | {bleu - base:+.2f} | [{low:+.2f}, {high:+.2f}] | "
              f"{full.test(hyps).p_value:.3f} | {half.test(hyps).p_value:.3f} |", flush=True)


if __name__ == "__main__":
    main()
