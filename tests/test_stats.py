"""The paired bootstrap (compare-mt) and the correlations on made-up systems: no model, well under a second each.

The p-value is checked against an independent resampling written here with sacreBLEU itself: the same numpy
seed draws the same full-size resamples, so a wrong direction, ratio or sample size changes p."""
import random
from collections import Counter

import numpy as np
import pytest
import sacrebleu

from fairseq_headprune.stats import BleuBootstrap, correlations

WORDS = [f"w{i}" for i in range(300)]


def _corpus(n=60, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))) for _ in range(n)]


def _damage(sentences, share, seed):
    """Each word replaced by a random one with probability `share`."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) if rng.random() < share else w for w in s.split()) for s in sentences]


REFS = _corpus()
GOOD = _damage(REFS, 0.15, 1)
GOOD_2 = _damage(REFS, 0.17, 2)  # about as good as GOOD
BAD = _damage(REFS, 0.75, 3)


def sentence_stats(hyp: str, ref: str) -> np.ndarray:
    """Hypothesis length, reference length, then matched and total n-grams for n = 1..4 (clipped counts)."""
    h, r = hyp.split(), ref.split()
    row = [len(h), len(r)]
    for n in range(1, 5):
        hc = Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
        rc = Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
        row += [sum(min(c, rc[g]) for g, c in hc.items()), max(len(h) - n + 1, 0)]
    return np.array(row, dtype=float)


def corpus_bleu(stats: np.ndarray) -> float:
    """BLEU from summed statistics (Papineni et al.): geometric mean of the precisions x brevity penalty."""
    hyp_len, ref_len = stats[0], stats[1]
    matched, total = stats[2::2], stats[3::2]
    assert matched.min() > 0  # no smoothing needed on these corpora
    log_precision = np.log(matched / total).mean()
    brevity = 1.0 if hyp_len > ref_len else np.exp(1 - ref_len / hyp_len)
    return 100 * brevity * np.exp(log_precision)


def reference_p(refs, a, b, samples, seed=1, size=None):
    """One-sided p of the documented test, computed from scratch: the share of full-size resamples (drawn as
    compare-mt draws them) in which the system with the higher BLEU on the whole set does not score higher."""
    size = len(refs) if size is None else size
    stats = {id(s): np.stack([sentence_stats(h, r) for h, r in zip(s, refs)]) for s in (a, b)}
    everything = list(range(len(refs)))
    bleu = lambda hyps, ids: corpus_bleu(stats[id(hyps)][ids].sum(0))  # noqa: E731
    better, worse = (a, b) if bleu(a, everything) >= bleu(b, everything) else (b, a)
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        draws = [np.random.choice(everything, size=size, replace=True) for _ in range(samples)]
    finally:
        np.random.set_state(state)
    return sum(not bleu(better, ids) > bleu(worse, ids) for ids in draws) / samples


def test_the_reference_bleu_here_is_sacrebleu():
    for hyps in (GOOD, GOOD_2, _damage(REFS, 0.4, 4)[:40]):
        stats = np.stack([sentence_stats(h, r) for h, r in zip(hyps, REFS)]).sum(0)
        assert corpus_bleu(stats) == pytest.approx(sacrebleu.corpus_bleu(hyps, [REFS[:len(hyps)]]).score, abs=1e-9)


def test_identical_systems_give_p_1():
    result = BleuBootstrap(REFS, GOOD, samples=100).test(list(GOOD))
    assert result.p_value == 1.0 and result.baseline_wins == result.system_wins == 0.0


def test_heavily_damaged_system_is_significant_in_both_directions():
    worse = BleuBootstrap(REFS, GOOD, samples=200).test(BAD)
    assert worse.p_value < 0.01 and worse.baseline_wins == 1.0 and worse.system_wins == 0.0
    better = BleuBootstrap(REFS, BAD, samples=200).test(GOOD)
    assert better.p_value < 0.01 and better.system_wins == 1.0 and better.baseline_wins == 0.0


def test_difference_interval_brackets_the_measured_difference():
    """Identical systems: (0, 0). A damaged one: wholly below 0, around the difference on the whole set; swapping
    the two systems mirrors it (the same resamples)."""
    assert BleuBootstrap(REFS, GOOD, samples=100).difference_interval(list(GOOD)) == (0.0, 0.0)
    low, high = BleuBootstrap(REFS, GOOD, samples=200).difference_interval(BAD)
    measured = sacrebleu.corpus_bleu(BAD, [REFS]).score - sacrebleu.corpus_bleu(GOOD, [REFS]).score
    assert low < measured < high < 0
    mirrored = BleuBootstrap(REFS, BAD, samples=200).difference_interval(GOOD)
    assert mirrored == pytest.approx((-high, -low), abs=1e-9)
    with pytest.raises(ValueError):
        BleuBootstrap(REFS, GOOD, samples=10).difference_interval(BAD, level=1.0)


def test_swapping_the_two_systems_gives_the_same_p():
    ab = BleuBootstrap(REFS, GOOD, samples=200).test(GOOD_2)
    ba = BleuBootstrap(REFS, GOOD_2, samples=200).test(GOOD)
    assert ab.p_value == ba.p_value
    assert (ab.baseline_wins, ab.system_wins) == (ba.system_wins, ba.baseline_wins)


@pytest.mark.parametrize("baseline,system", [(GOOD, GOOD_2), (GOOD_2, GOOD)])
def test_p_is_the_share_of_full_size_resamples_the_better_system_does_not_win(baseline, system):
    samples = 200
    result = BleuBootstrap(REFS, baseline, samples=samples).test(system)
    expected = reference_p(REFS, baseline, system, samples)
    # close systems: neither wins every resample, so the direction and the sample size both matter
    assert 0.05 < expected < 0.95
    assert result.p_value == pytest.approx(expected, abs=1e-12)
    assert result.p_value == pytest.approx(1.0 - max(result.baseline_wins, result.system_wins), abs=1e-12)
    # half-size resamples (compare-mt's default) would give another p on these systems
    assert reference_p(REFS, baseline, system, samples, size=len(REFS) // 2) != pytest.approx(expected, abs=1e-12)


def test_number_of_resamples_and_seed_are_honoured():
    for samples in (7, 50):
        result = BleuBootstrap(REFS, GOOD, samples=samples).test(GOOD_2)
        assert result.p_value == pytest.approx(reference_p(REFS, GOOD, GOOD_2, samples), abs=1e-12)
        # every share is a count of the resamples out of `samples`
        assert (result.baseline_wins * samples) == pytest.approx(round(result.baseline_wins * samples))
    other_seed = BleuBootstrap(REFS, GOOD, samples=50, seed=7).test(GOOD_2)
    assert other_seed.p_value == pytest.approx(reference_p(REFS, GOOD, GOOD_2, 50, seed=7), abs=1e-12)


def test_a_smaller_sample_ratio_draws_smaller_resamples():
    n = len(REFS)
    half = BleuBootstrap(REFS, GOOD, samples=100, sample_ratio=0.5).test(GOOD_2)
    assert half.p_value == pytest.approx(reference_p(REFS, GOOD, GOOD_2, 100, size=int(n * 0.5)), abs=1e-12)
    assert BleuBootstrap(REFS, GOOD, samples=100, sample_ratio=1.0).test(GOOD_2).p_value == pytest.approx(
        reference_p(REFS, GOOD, GOOD_2, 100), abs=1e-12)


def test_bootstrap_leaves_the_global_numpy_random_state_alone():
    np.random.seed(123)
    expected = np.random.rand(3)
    np.random.seed(123)
    BleuBootstrap(REFS, GOOD, samples=20).test(BAD)
    assert np.array_equal(np.random.rand(3), expected)


def test_correlations_on_known_values():
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    y = [2.0, 4.0, 6.0, 8.0, 10.0]
    r = correlations(x, y)
    assert r["n"] == 5 and r["pearson_r"] == pytest.approx(1.0) and r["spearman_r"] == pytest.approx(1.0)
    assert r["pearson_p"] < 1e-6
    # monotone but not linear: Spearman 1, Pearson below 1; reversed order: -1
    cube = correlations(x, [v ** 3 for v in x])
    assert cube["spearman_r"] == pytest.approx(1.0) and 0.9 < cube["pearson_r"] < 0.99
    assert correlations(x, y[::-1])["spearman_r"] == pytest.approx(-1.0)
    # by hand: x = (1, 2, 3), y = (1, 3, 2): Pearson = 0.5, Spearman = 0.5
    small = correlations([1.0, 2.0, 3.0], [1.0, 3.0, 2.0])
    assert small["pearson_r"] == pytest.approx(0.5) and small["spearman_r"] == pytest.approx(0.5)


# ------------------------------------------------------------------ the vectorised test against a plain loop

def loop_bootstrap(refs, baseline, system, samples, seed=1, sample_ratio=1.0):
    """compare-mt's paired bootstrap written out as a loop, one resample at a time: the same draws (numpy's global
    generator seeded, one np.random.choice of int(n x ratio) sentences per resample), each resample scored by
    compare-mt's SacreBleuScorer, strict wins counted; the p-value and wins as BleuBootstrap reports them."""
    from compare_mt.scorers import SacreBleuScorer

    scorer = SacreBleuScorer()
    split_refs = [r.split() for r in refs]
    cached = [np.array(scorer.cache_stats(split_refs, [h.split() for h in hyps])) for hyps in (baseline, system)]
    ids, size = list(range(len(refs))), int(len(refs) * sample_ratio)
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        baseline_wins = system_wins = 0
        for _ in range(samples):
            drawn = np.random.choice(ids, size=size, replace=True)
            left, right = (scorer.score_cached_corpus(drawn, stats)[0] for stats in cached)
            baseline_wins += left > right
            system_wins += left < right
    finally:
        np.random.set_state(state)
    baseline_wins, system_wins = baseline_wins / float(samples), system_wins / float(samples)
    return 1.0 - max(baseline_wins, system_wins), baseline_wins, system_wins


ONE_SENTENCE = GOOD[:5] + [BAD[5]] + GOOD[6:]  # the baseline but for one sentence: most resamples tie exactly
SHORT = [" ".join(s.split()[: len(s.split()) * 2 // 3]) for s in GOOD_2]  # brevity penalty on every resample


@pytest.mark.parametrize("seed", [1, 7, 123])
@pytest.mark.parametrize("sample_ratio", [1.0, 0.5, 0.3, 0.04])
def test_vectorised_bootstrap_equals_the_loop(seed, sample_ratio):
    boot = BleuBootstrap(REFS, GOOD, samples=150, seed=seed, sample_ratio=sample_ratio)
    for system in (GOOD_2, BAD, ONE_SENTENCE, SHORT, list(GOOD)):
        got = boot.test(system)
        assert (got.p_value, got.baseline_wins, got.system_wins) == loop_bootstrap(
            REFS, GOOD, system, 150, seed, sample_ratio)


def test_resamples_are_compare_mts_draws_of_the_asked_size():
    n = len(REFS)
    for samples, ratio in ((40, 1.0), (25, 0.5), (10, 0.25), (5, 0.01)):
        ids = BleuBootstrap(REFS, GOOD, samples=samples, seed=3, sample_ratio=ratio).resample_ids
        assert ids.shape == (samples, int(n * ratio))
        np.random.seed(3)
        assert np.array_equal(ids, [np.random.choice(list(range(n)), size=int(n * ratio), replace=True)
                                    for _ in range(samples)])
    # the size changes the answer: half-size resamples are not full-size ones
    full = BleuBootstrap(REFS, GOOD, samples=200).test(GOOD_2)
    half = BleuBootstrap(REFS, GOOD, samples=200, sample_ratio=0.5).test(GOOD_2)
    assert (half.p_value, half.baseline_wins, half.system_wins) == loop_bootstrap(REFS, GOOD, GOOD_2, 200,
                                                                                 sample_ratio=0.5)
    assert half.p_value != full.p_value
    with pytest.raises(ValueError):
        BleuBootstrap(REFS, GOOD, samples=0)


def test_bleu_per_resample_is_sacrebleus_and_near_ties_are_decided_exactly(monkeypatch):
    from fairseq_headprune import stats as stats_module
    from fairseq_headprune.stats import bleu_from_sums

    boot = BleuBootstrap(REFS, GOOD, samples=100, sample_ratio=0.1)  # 6 sentences: zero matches at some orders
    sums = np.concatenate([boot.resample_sums(boot.system_stats(s)) for s in (GOOD, BAD, SHORT, [""] * len(REFS))])
    exact = [boot._exact_bleu(row) for row in sums]
    assert np.allclose(bleu_from_sums(sums), exact, rtol=0, atol=1e-11)
    whole = boot.system_stats(GOOD_2).sum(0)
    assert bleu_from_sums(whole)[0] == pytest.approx(sacrebleu.corpus_bleu(GOOD_2, [REFS]).score, abs=1e-11)
    # rescoring every resample with sacreBLEU, or none, decides the same
    results = []
    for margin in (float("inf"), 0.0):
        monkeypatch.setattr(stats_module, "_NEAR_TIE", margin)
        results.append([BleuBootstrap(REFS, GOOD, samples=100, sample_ratio=r).test(s)
                        for r in (1.0, 0.1) for s in (GOOD_2, ONE_SENTENCE, SHORT)])
    assert results[0] == results[1]


def test_sentences_translated_as_the_baseline_reuse_its_statistics():
    boot = BleuBootstrap(REFS, GOOD, samples=10)
    for system in (ONE_SENTENCE, GOOD_2, list(GOOD)):
        assert np.array_equal(boot.system_stats(system), boot._stats(system, range(len(REFS))))
    with pytest.raises(ValueError):
        boot.test(GOOD_2[:-1])


def test_chrf_bootstrap_scores_as_sacrebleu_on_the_bleu_resamples():
    """chrF beside BLEU: sacreBLEU's corpus chrF, its one-sided paired p on the very resamples of the BLEU test."""
    from fairseq_headprune.stats import ChrfBootstrap

    bleu = BleuBootstrap(REFS, GOOD, samples=300, seed=4)
    chrf = ChrfBootstrap(bleu, REFS)
    assert chrf.score(BAD) == pytest.approx(sacrebleu.corpus_chrf(BAD, [REFS]).score)
    assert chrf.baseline_score == pytest.approx(sacrebleu.corpus_chrf(GOOD, [REFS]).score)
    assert chrf.test(GOOD).p_value == 1.0  # the baseline itself: every resample a tie
    worse = chrf.test(BAD)
    assert worse.p_value == 0.0 and worse.baseline_wins == 1.0  # far worse in every resample
    # the resamples are the BLEU test's: a resample's chrF is sacreBLEU's score of its summed sentences
    ids = bleu.resample_ids[7]
    picked = [BAD[i] for i in ids]
    assert chrf.resample_scores(chrf.stats(BAD))[7] == pytest.approx(
        sacrebleu.corpus_chrf(picked, [[REFS[i] for i in ids]]).score)
    assert chrf.signature().startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:")
