"""Significance and correlation: compare-mt's paired bootstrap for BLEU, vectorised with numpy; scipy for
correlations."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

# Two resample scores closer than this (BLEU points) are recomputed one by one with sacreBLEU's own
# compute_bleu, so that a near-tie is decided by exactly the floats compare-mt compares. numpy's log/exp may
# differ from math.log/math.exp in the last bit (about 1e-13 BLEU here): a margin of 1e-9 is ample.
_NEAR_TIE = 1e-9


@dataclass(frozen=True)
class BootstrapResult:
    p_value: float  # share of resamples where the observed ordering of the two systems does not hold
    baseline_wins: float
    system_wins: float


class BleuBootstrap:
    """Paired bootstrap resampling (Koehn 2004) of corpus sacreBLEU against one fixed baseline.

    The same test as compare-mt's `eval_with_paired_bootstrap` on its `SacreBleuScorer` statistics, computed for
    all resamples at once: the resample indices are drawn as compare-mt draws them (one `np.random.choice` of
    int(n x sample_ratio) sentences per resample, global numpy generator seeded with `seed`, restored after), the
    per-sentence sufficient statistics (hypothesis and reference lengths, matched and total n-grams per order)
    are summed per resample by one product with the resample count matrix, and BLEU follows per resample as
    sacreBLEU computes it (exp smoothing). Wins, and so p-values, are identical to compare-mt's loop: resamples
    whose two scores are within 1e-9 of each other are rescored with sacreBLEU itself. The indices and the
    baseline's scores are computed once and reused for every system, and so are the baseline's sentence
    statistics for every sentence a system translates as the baseline did.

    Resamples are full-size by default (sample_ratio 1.0, the textbook bootstrap); compare-mt's own default, and
    presumably Michel et al.'s setting, is 0.5: half-size resamples, a wider spread, fewer significant
    differences. The p-value is one-sided in the observed direction: 1 - the share of resamples in which the
    better of the two systems wins.
    """

    def __init__(self, references: Sequence[str], baseline: Sequence[str], samples: int = 1000, seed: int = 1,
                 sample_ratio: float = 1.0):
        from compare_mt.scorers import SacreBleuScorer

        if not 0 < sample_ratio <= 1:
            raise ValueError(f"sample_ratio must be in (0, 1]: {sample_ratio}")
        if samples < 1:
            raise ValueError(f"samples must be at least 1: {samples}")
        self.scorer = SacreBleuScorer()
        self.order = self.scorer.bleu.max_ngram_order
        self.refs = [r.split() for r in references]
        self.samples, self.seed, self.sample_ratio = samples, seed, sample_ratio
        self.sample_size = int(len(self.refs) * sample_ratio)  # compare-mt's size, rounded down
        self.baseline = list(baseline)
        self.baseline_stats = self._stats(self.baseline, range(len(self.refs)))
        self._resample_ids = self._counts = self._baseline_sums = self._baseline_bleu = None

    def _stats(self, hypotheses: Sequence[str], ids: Sequence[int]) -> np.ndarray:
        """compare-mt's cached statistics of sentences `ids` as an (len(ids), 2 + 2 x order) int64 array:
        hypothesis length, reference length, matched n-grams for n = 1..order, total n-grams for n = 1..order.
        Each sentence's row depends on its hypothesis and reference alone."""
        stats = self.scorer.cache_stats([self.refs[i] for i in ids], [hypotheses[i].split() for i in ids])
        return np.array(stats, dtype=np.int64).reshape(len(ids), 2 + 2 * self.order)

    def system_stats(self, system: Sequence[str]) -> np.ndarray:
        """The system's sentence statistics; sentences translated as the baseline did reuse its rows (a masked
        head usually changes a part of the set only)."""
        if len(system) != len(self.refs):
            raise ValueError(f"{len(system)} hypotheses for {len(self.refs)} references")
        stats = self.baseline_stats.copy()
        changed = [i for i, (h, b) in enumerate(zip(system, self.baseline)) if h != b]
        if changed:
            stats[changed] = self._stats(system, changed)
        return stats

    @property
    def resample_ids(self) -> np.ndarray:
        """The (samples, int(n x sample_ratio)) sentence indices of every resample, as compare-mt draws them."""
        if self._resample_ids is None:
            state = np.random.get_state()
            np.random.seed(self.seed)  # the same resamples for every system: comparable p-values, reproducible
            try:
                # one draw of samples x size equals `samples` successive draws of `size` (the same randint stream)
                self._resample_ids = np.random.choice(
                    len(self.refs), size=(self.samples, self.sample_size), replace=True)
            finally:
                np.random.set_state(state)
        return self._resample_ids

    def resample_sums(self, stats: np.ndarray) -> np.ndarray:
        """(samples, columns) int64: each resample's summed statistics, as compare-mt's np.sum(stats[ids], 0)."""
        if self._counts is None:
            n = len(self.refs)
            rows = np.arange(self.samples)[:, None] * n
            # how often each sentence is drawn in each resample; a float64 product of integers stays exact
            self._counts = np.bincount((rows + self.resample_ids).ravel(), minlength=self.samples * n).reshape(
                self.samples, n).astype(np.float64)
        return np.rint(self._counts @ stats.astype(np.float64)).astype(np.int64)

    def _exact_bleu(self, sums: np.ndarray) -> float:
        """sacreBLEU's score from one resample's sums, with the arguments compare-mt passes."""
        s = self.scorer
        return s.bleu.compute_bleu(
            correct=sums[2:2 + self.order], total=sums[2 + self.order:], sys_len=int(sums[0]), ref_len=int(sums[1]),
            smooth_method=s.smooth_method, smooth_value=s.smooth_value, effective_order=s.effective_order,
        ).score

    def test(self, system: Sequence[str]) -> BootstrapResult:
        return self.test_stats(self.system_stats(system))

    def _baseline_resamples(self) -> Tuple[np.ndarray, np.ndarray]:
        """The baseline's summed statistics and BLEU in every resample, computed once."""
        if self._baseline_bleu is None:
            self._baseline_sums = self.resample_sums(self.baseline_stats)
            self._baseline_bleu = bleu_from_sums(self._baseline_sums, self.order)
        return self._baseline_sums, self._baseline_bleu

    def difference_interval(self, system: Sequence[str], level: float = 0.95) -> Tuple[float, float]:
        """The central `level` interval of system minus baseline BLEU over the resamples (percentile bootstrap):
        how far a difference measured on this test set could be from the one on another draw of it. Meaningful
        with full-size resamples (sample_ratio 1); half-size ones widen it by about sqrt(2)."""
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1): {level}")
        score = bleu_from_sums(self.resample_sums(self.system_stats(system)), self.order)
        diff = score - self._baseline_resamples()[1]
        low, high = np.percentile(diff, [50 * (1 - level), 50 * (1 + level)])
        return float(low), float(high)

    def test_stats(self, stats: np.ndarray) -> BootstrapResult:
        """The test on a system's sentence statistics (rows as `baseline_stats`)."""
        base_sums, base = self._baseline_resamples()
        base = base.copy()
        sums = self.resample_sums(stats)
        score = bleu_from_sums(sums, self.order)
        same = (sums == base_sums).all(axis=1)  # equal statistics: an exact tie whatever the arithmetic
        for i in np.flatnonzero(~same & (np.abs(score - base) <= _NEAR_TIE)):
            base[i], score[i] = self._exact_bleu(base_sums[i]), self._exact_bleu(sums[i])
        # compare-mt's counts: left = baseline, right = system, ties count for neither
        baseline_wins = int(np.count_nonzero(~same & (base > score))) / float(self.samples)
        system_wins = int(np.count_nonzero(~same & (base < score))) / float(self.samples)
        return BootstrapResult(1.0 - max(baseline_wins, system_wins), baseline_wins, system_wins)


class ChrfBootstrap:
    """Paired bootstrap of corpus chrF (sacreBLEU's CHRF, its defaults: chrF2, character 6-grams) against a fixed
    baseline, on the very resamples a BleuBootstrap drew: the same sentences in every resample, the same one-sided
    p in the observed direction. A resample's chrF is sacreBLEU's own score of its summed sentence statistics (as
    sacrebleu.significance resamples any metric)."""

    def __init__(self, bleu: BleuBootstrap, references: Sequence[str]):
        from sacrebleu.metrics import CHRF

        self.metric, self.bleu = CHRF(), bleu
        self.references = list(references)
        self.baseline_score = self.score(bleu.baseline)  # (sacreBLEU's signature needs one corpus_score first)
        self.baseline_stats = self.stats(bleu.baseline)
        self._baseline_scores = self.resample_scores(self.baseline_stats)

    def stats(self, system: Sequence[str]) -> np.ndarray:
        """(sentences, statistics) int64: sacreBLEU's chrF statistics of each sentence."""
        if len(system) != len(self.references):
            raise ValueError(f"{len(system)} hypotheses for {len(self.references)} references")
        return np.array(self.metric._extract_corpus_statistics(list(system), [self.references]), dtype=np.int64)

    def score(self, system: Sequence[str]) -> float:
        """Corpus chrF of a system: sacreBLEU's corpus_score."""
        return float(self.metric.corpus_score(list(system), [self.references]).score)

    def signature(self) -> str:
        """sacreBLEU's signature of the chrF settings ("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:...")."""
        return str(self.metric.get_signature())

    def resample_scores(self, stats: np.ndarray) -> np.ndarray:
        sums = self.bleu.resample_sums(stats)
        return np.array([self.metric._compute_score_from_stats(list(row)).score for row in sums])

    def difference_interval(self, system: Sequence[str], level: float = 0.95) -> Tuple[float, float]:
        """The central `level` interval of system minus baseline chrF over the resamples (percentile bootstrap), as
        BleuBootstrap.difference_interval."""
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1): {level}")
        diff = self.resample_scores(self.stats(system)) - self._baseline_scores
        low, high = np.percentile(diff, [50 * (1 - level), 50 * (1 + level)])
        return float(low), float(high)

    def test(self, system: Sequence[str]) -> BootstrapResult:
        """The one-sided paired test of system against the baseline, as BleuBootstrap.test does for BLEU."""
        score, base = self.resample_scores(self.stats(system)), self._baseline_scores
        baseline_wins = int(np.count_nonzero(base > score)) / float(self.bleu.samples)
        system_wins = int(np.count_nonzero(base < score)) / float(self.bleu.samples)
        return BootstrapResult(1.0 - max(baseline_wins, system_wins), baseline_wins, system_wins)


def bleu_from_sums(sums: np.ndarray, order: int = 4) -> np.ndarray:
    """Corpus BLEU of each row of summed sacreBLEU statistics (sys_len, ref_len, correct[order], total[order]),
    step by step as sacreBLEU's `BLEU.compute_bleu` with its default exp smoothing and no effective order: a
    zero match count at order n scores 100 / (2^k x total), k the zero counts so far; the orders from the first
    zero total on score log 0 := -9999999999; no match at all scores 0. Equal to sacreBLEU up to the last bit of
    log and exp."""
    sums = np.atleast_2d(sums)
    sys_len, ref_len = sums[:, 0], sums[:, 1]
    correct, total = sums[:, 2:2 + order], sums[:, 2 + order:2 + 2 * order]
    with np.errstate(divide="ignore", invalid="ignore"):
        brevity = np.where(sys_len < ref_len, np.where(sys_len > 0, np.exp(1 - ref_len / sys_len), 0.0), 1.0)
        counted = np.cumprod(total != 0, axis=1).astype(bool)  # sacreBLEU stops at the first empty order
        unmatched = counted & (correct == 0)
        smooth = np.cumprod(np.where(unmatched, 2.0, 1.0), axis=1)
        precision = np.where(unmatched, 100.0 / (smooth * total), 100.0 * correct / total)
        log_p = np.where(counted & (precision != 0), np.log(np.where(counted, precision, 1.0)), -9999999999)
    log_sum = log_p[:, 0]
    for n in range(1, order):  # summed in sacreBLEU's order
        log_sum = log_sum + log_p[:, n]
    return np.where(correct.any(axis=1), brevity * np.exp(log_sum / order), 0.0)


def correlations(x: List[float], y: List[float]) -> dict:
    """Pearson and Spearman r with their p-values."""
    from scipy import stats

    pearson, spearman = stats.pearsonr(x, y), stats.spearmanr(x, y)
    return {
        "n": len(x),
        "pearson_r": float(pearson[0]), "pearson_p": float(pearson[1]),
        "spearman_r": float(spearman[0]), "spearman_p": float(spearman[1]),
    }
