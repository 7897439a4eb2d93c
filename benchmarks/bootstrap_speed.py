"""Speed of the paired bootstrap: compare-mt's loop over resamples (the implementation before vectorisation,
kept here verbatim) against the vectorised `BleuBootstrap`, on a single-head sweep's shape: many systems against
one baseline (145 = the 8-head De-En model's heads), 1000 resamples, on the demo's 64 sentences and on 1000.

Made-up but real-ish corpora (Zipfian words, sentences of 1-40 words; systems with substitutions, deletions,
truncated or empty outputs, some identical to the baseline or differing in one sentence, so exact ties occur).
Checks on the way, every one an assertion: the same wins and p-values for every system, and full-set BLEU from
the summed statistics equal to sacrebleu.corpus_bleu and compare-mt's SacreBleuScorer.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bootstrap_speed.py [--systems 145] [--samples 1000] [--sizes 64 1000]
"""
import argparse
import dataclasses
import random
import time

import numpy as np


class LoopBleuBootstrap:
    """The implementation replaced (fairseq_headprune/stats.py before vectorisation): compare-mt's
    eval_with_paired_bootstrap, one resample at a time, on cached statistics."""

    def __init__(self, references, baseline, samples=1000, seed=1, sample_ratio=1.0):
        from compare_mt.scorers import SacreBleuScorer

        self.scorer = SacreBleuScorer()
        self.refs = [r.split() for r in references]
        self.samples, self.seed, self.sample_ratio = samples, seed, sample_ratio
        self.baseline_stats = self._stats(baseline)

    def _stats(self, hypotheses):
        return _StatsWithArray(self.scorer.cache_stats(self.refs, [h.split() for h in hypotheses]))

    def test(self, system):
        return self.test_stats(self._stats(system))

    def test_stats(self, stats):
        from compare_mt.sign_utils import eval_with_paired_bootstrap

        state = np.random.get_state()
        np.random.seed(self.seed)
        try:
            wins, _ = eval_with_paired_bootstrap(
                self.refs, [None, None], None, self.scorer, num_samples=self.samples, sample_ratio=self.sample_ratio,
                cache_stats=[self.baseline_stats, stats],
            )
        finally:
            np.random.set_state(state)
        baseline_wins, system_wins = wins[0][0], wins[0][1]
        return 1.0 - max(baseline_wins, system_wins), baseline_wins, system_wins


class _StatsWithArray(list):
    def __init__(self, stats):
        super().__init__(stats)
        self.array = np.array(stats)

    def __array__(self, dtype=None, copy=None):
        return self.array if dtype is None else self.array.astype(dtype)


def corpora(n, systems, seed=0):
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(5000)]
    weights = [1 / (i + 1) for i in range(len(vocab))]

    def sentence():
        return " ".join(rng.choices(vocab, weights, k=rng.randint(1, 40)))

    def damage(sentences, share):
        out = []
        for s in sentences:
            words = [w for w in s.split() if rng.random() > share / 3]
            words = [rng.choices(vocab, weights)[0] if rng.random() < share else w for w in words]
            if rng.random() < share / 4:
                words = words[: len(words) // 2]
            out.append(" ".join(words))
        return out

    refs = [sentence() for _ in range(n)]
    baseline = damage(refs, 0.3)
    outs = []
    for i in range(systems):
        kind = i % 10
        if kind == 0:
            outs.append(list(baseline))  # a head whose removal changes nothing
        elif kind == 1:
            j = rng.randrange(n)
            outs.append(baseline[:j] + damage([refs[j]], 0.6) + baseline[j + 1:])  # one sentence changed
        elif kind == 2 and i == 2:
            outs.append([""] * n)  # a collapsed model
        elif kind == 9:
            outs.append(damage(refs, rng.uniform(0.4, 0.95)))  # a head that matters: every sentence worse
        else:  # as a masked head usually does: some sentences translated otherwise, a little better or worse
            share, changed = rng.uniform(0.25, 0.35), rng.uniform(0.05, 0.6)
            outs.append([damage([r], share)[0] if rng.random() < changed else b for r, b in zip(refs, baseline)])
    return refs, baseline, outs


def check_full_set_bleu(refs, hyps):
    import sacrebleu
    from compare_mt.scorers import SacreBleuScorer

    from fairseq_headprune.stats import bleu_from_sums

    scorer = SacreBleuScorer()
    stats = np.array(scorer.cache_stats([r.split() for r in refs], [h.split() for h in hyps]), dtype=np.int64)
    ours = float(bleu_from_sums(stats.sum(0))[0])
    compare_mt = scorer.score_corpus([r.split() for r in refs], [h.split() for h in hyps])[0]
    sacre = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert abs(ours - sacre) < 1e-9 and abs(ours - compare_mt) < 1e-9, (ours, sacre, compare_mt)
    return ours, sacre


def main():
    from fairseq_headprune.stats import BleuBootstrap

    p = argparse.ArgumentParser()
    p.add_argument("--systems", type=int, default=145)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 1000])
    p.add_argument("--sample-ratio", type=float, default=1.0)
    a = p.parse_args()
    for n in a.sizes:
        refs, baseline, systems = corpora(n, a.systems)
        for hyps in (baseline, systems[3], systems[-1]):
            check_full_set_bleu(refs, hyps)
        old = LoopBleuBootstrap(refs, baseline, a.samples, sample_ratio=a.sample_ratio)
        new = BleuBootstrap(refs, baseline, a.samples, sample_ratio=a.sample_ratio)
        # test(system) = sentence statistics (sacreBLEU) + resampling (what was vectorised), timed apart
        t = time.perf_counter()
        old_stats = [old._stats(s) for s in systems]
        t_old_stats = time.perf_counter() - t
        t = time.perf_counter()
        new_stats = [new.system_stats(s) for s in systems]
        t_new_stats = time.perf_counter() - t
        assert all(np.array_equal(np.array(o), n_) for o, n_ in zip(old_stats, new_stats))
        t = time.perf_counter()
        old_results = [old.test_stats(s) for s in old_stats]
        t_old = time.perf_counter() - t
        t = time.perf_counter()
        new_results = [dataclasses.astuple(new.test_stats(s)) for s in new_stats]
        t_new = time.perf_counter() - t
        assert new_results == old_results, "the vectorised bootstrap must give compare-mt's wins exactly"
        assert [dataclasses.astuple(new.test(s)) for s in systems[:12]] == old_results[:12]  # the public path
        significant = sum(r[0] < 0.05 for r in new_results)
        e2e_old, e2e_new = t_old_stats + t_old, t_new_stats + t_new
        print(f"{n} sentences, {a.systems} systems vs one baseline, {a.samples} resamples "
              f"({significant} significant at p < 0.05, identical p-values and wins): "
              f"resampling loop {t_old:.2f} s, vectorised {t_new:.3f} s, {t_old / t_new:.0f}x; "
              f"whole test() from hypotheses {e2e_old:.2f} s vs {e2e_new:.2f} s, {e2e_old / e2e_new:.1f}x "
              f"(sentence statistics {t_old_stats:.2f} s vs {t_new_stats:.2f} s, unchanged sentences reused)")

if __name__ == "__main__":
    main()
