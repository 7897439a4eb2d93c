"""Timing decoders against each other on the same batches: a warm-up, then interleaved rounds, so that a change in
the machine's load hits every decoder alike; and the paired statistics of the seconds (ratios within a round or a
batch, the sign test).

A decoder is a function of a list of batches returning at least {"seconds": float, "hypotheses": ...} (the fairseq
and CTranslate2 runs of engines.fairseq_engine and engines.ct2, or a stand-in in the tests).
"""
from __future__ import annotations

import math
import os
import random
import statistics
from typing import Callable, Dict, Hashable, List, Mapping, Optional, Sequence

import numpy as np
from scipy import stats as scipy_stats

Decoder = Callable[[Sequence], Dict]
Round = Dict[Hashable, List[Dict]]  # each decoder's results in one round, one per call


def warm_up(decoders: Mapping[Hashable, Decoder], batches: Sequence) -> None:
    """Every decoder decodes the first batch once: kernels and caches meet the shapes before the clock runs."""
    for decode in decoders.values():
        decode(batches[:1])


def interleaved(decoders: Mapping[Hashable, Decoder], batches: Sequence, seed: str) -> Round:
    """One round batch by batch: every batch decoded by every decoder in turn, in an order drawn anew for every
    batch from a random generator seeded with `seed`, so that no decoder owes its time to its place in the order or
    to the decoder before it. Each decoder's results, one per batch."""
    order = random.Random(seed)
    results: Round = {key: [] for key in decoders}
    for batch in batches:
        for key in order.sample(list(decoders), len(decoders)):
            results[key].append(decoders[key]([batch]))
    return results


def in_turn(decoders: Mapping[Hashable, Decoder], batches: Sequence) -> Round:
    """One round decoder by decoder: each decodes all the batches at once, in the order given."""
    return {key: [decode(batches)] for key, decode in decoders.items()}


def measure(decoders: Mapping[Hashable, Decoder], batches: Sequence, runs: int,
            seed: Optional[Callable[[int], str]] = None, warm: bool = True, progress=None) -> List[Round]:
    """Time the decoders on the same batches: a warm-up (unless `warm` is False), then `runs` interleaved rounds,
    batch by batch in the order seed(round) draws (interleaved) or, without `seed`, decoder by decoder (in_turn).
    `progress(done, runs)` is called after each round. Every round's results."""
    if warm:
        warm_up(decoders, batches)
    rounds = []
    for r in range(runs):
        rounds.append(interleaved(decoders, batches, seed(r)) if seed else in_turn(decoders, batches))
        if progress:
            progress(r + 1, runs)
    return rounds


def by_decoder(rounds: Sequence[Round]) -> Dict[Hashable, List[Dict]]:
    """Each decoder's result of every round, when every round called it once (decoder by decoder: in_turn)."""
    return {key: [results[key][0] for results in rounds] for key in (rounds[0] if rounds else {})}


def seconds(results: Sequence[Dict]) -> float:
    """The seconds of a decoder's calls in a round, summed."""
    return sum(got["seconds"] for got in results)


def hypotheses(results: Sequence[Dict]) -> Dict:
    """The hypotheses of a decoder's calls in a round, by sentence id."""
    written: Dict = {}
    for got in results:
        written.update(got["hypotheses"])
    return written


def timed_rounds(decoders: Mapping[Hashable, Callable], samples, runs: int, forced: int,
                 progress=None) -> Dict[str, List[float]]:
    """Seconds of every decoder (a function of (batches, forced)) on every batch of every round, in that order, after
    a warm-up, every hypothesis forced to `forced` tokens (0: as decoded); interleaved batch by batch in an order
    drawn anew for each batch. Forced decoders that wrote different token counts in the first round are an error
    (not equal work)."""
    at_length = {key: (lambda batches, decode=decode: decode(batches, forced)) for key, decode in decoders.items()}
    rounds = measure(at_length, samples, runs, seed=lambda r: f"cost-{r}-{forced}", progress=progress)
    per_batch = {key: [got["seconds"] for results in rounds for got in results[key]] for key in decoders}
    first = rounds[0] if rounds else {key: [] for key in decoders}
    tokens = {key: sum(len(h) for got in first[key] for h in got["hypotheses"].values()) for key in decoders}
    if forced and len(set(tokens.values())) > 1:
        raise RuntimeError(f"forced lengths gave different token counts {sorted(set(tokens.values()))}: not equal work")
    return per_batch


# --------------------------------------------------------------------------------------------- paired statistics


def paired_ratio(base: Sequence[float], other: Sequence[float]) -> float:
    """How many times faster `other` is than `base`, seconds paired within each round, averaged over rounds."""
    return statistics.mean(b / o for b, o in zip(base, other))


def paired_speedup(base: Sequence[float], other: Sequence[float]) -> float:
    """How many times faster `other` is than `base`: the median, over batches and rounds, of the ratio of the
    seconds each took on the same batch one right after the other (a burst of load from another process moves a
    few ratios, not the median)."""
    return statistics.median(b / o for b, o in zip(base, other))


INTERVAL_LEVEL, INTERVAL_RESAMPLES = 0.95, 2000


def speedup_interval(base: Sequence[float], other: Sequence[float], batches: int,
                     level: float = INTERVAL_LEVEL, resamples: int = INTERVAL_RESAMPLES, seed: int = 1) -> Dict:
    """paired_speedup with its percentile bootstrap interval. The seconds are round-major (every batch of round 1,
    then of round 2, as timed_rounds returns them); the bootstrap draws batches with replacement, each with the
    ratios of all its rounds (a batch's rounds share its sentences, so they are not independent draws), and takes
    the median of each draw. One batch: its rounds are drawn, the only spread there is (a draw of the one batch
    never moves: the interval would be its median alone); the interval then says how those sentences time from
    round to round, not how others would. What it rests on: the batches and the rounds."""
    ratios = np.asarray([b / o for b, o in zip(base, other)], dtype=float)
    rounds = len(ratios) // batches if batches else 0
    if not rounds or rounds * batches != len(ratios):
        raise ValueError(f"{len(ratios)} paired times are not {batches} batches in whole rounds")
    by_batch = ratios.reshape(rounds, batches).T  # one row per batch: its ratio in every round
    units = by_batch if batches > 1 else by_batch.T  # one batch: each round drawn alone
    draws = np.random.default_rng(seed).integers(0, len(units), size=(resamples, len(units)))
    medians = np.median(units[draws].reshape(resamples, -1), axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(medians, [tail, 1 - tail])
    return {"ratio": round(float(np.median(ratios)), 3), "low": round(float(low), 3),
            "high": round(float(high), 3), "level": level, "batches": batches, "rounds": rounds}


def rounds_interval(base: Sequence[float], other: Sequence[float], level: float = INTERVAL_LEVEL) -> Optional[Dict]:
    """paired_ratio (the mean of the rounds' ratios of seconds, each round the whole set) with its Student-t
    interval over the rounds: wide with few rounds, as it should be; None from one round (no spread to read).
    What it rests on: the rounds."""
    ratios = [b / o for b, o in zip(base, other)]
    if len(ratios) < 2:
        return None
    mean = statistics.mean(ratios)
    half = scipy_stats.t.ppf((1 + level) / 2, len(ratios) - 1) * statistics.stdev(ratios) / math.sqrt(len(ratios))
    return {"ratio": round(mean, 3), "low": round(mean - half, 3), "high": round(mean + half, 3), "level": level,
            "batches": None, "rounds": len(ratios)}


def target_verdict(interval: Dict, target: float) -> str:
    """A speed target against a measured interval: "met" (its lower end clears the target), "met at the median,
    not at the lower bound", or "missed"."""
    if interval["low"] >= target:
        return "met"
    return "met at the median, not at the lower bound" if interval["ratio"] >= target else "missed"


def interval_words(interval: Dict) -> str:
    """"1.26x (95% interval 1.20-1.31x; 16 batches x 3 rounds)" (rounds alone when whole sets were timed)."""
    batches, rounds = interval.get("batches"), interval["rounds"]
    rests = (f"{batches} batch{'es' * (batches != 1)} x " if batches else "") + f"{rounds} round{'s' * (rounds != 1)}"
    return (f"{interval['ratio']:.2f}x ({interval['level']:.0%} interval {interval['low']:.2f}-"
            f"{interval['high']:.2f}x; {rests})")


def sign_test(base: Sequence[float], other: Sequence[float]) -> Dict:
    """In how many of the paired batches `other` was faster, and the one-sided sign test's p (exact binomial, ties
    dropped): is it faster at all, beyond the machine's noise?"""
    wins = sum(o < b for b, o in zip(base, other))
    n = sum(o != b for b, o in zip(base, other))
    p = sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n if n else 1.0
    return {"faster_batches": wins, "batches": n, "p": round(p, 5)}


def load_average() -> Optional[float]:
    """The 1-minute load average (None where the system has none): what a timing says about the machine's load.
    One thread timing alone reads about 1; another CPU-bound process beside it, about 2, and slices time lower
    then (docs/compress.md, Limits)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None
