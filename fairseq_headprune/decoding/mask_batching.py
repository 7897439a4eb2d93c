"""How many masks share one beam search: `--masks-per-batch auto` (the default) or a fixed number.

Sharing a beam search between k masks (each sentence repeated once per mask, every row with its own ξ) pays
fairseq's per-step overhead once for k masks, and costs the same arithmetic per mask. Which wins depends on the
set and the machine: on a small CPU, a greedy search of a few dozen rows per step runs faster per mask when
several masks share it, while a beam search of several hundred rows per step runs slower shared
(results/benchmarks/); on a GPU sharing wins almost always. No fixed number suits every set, and
the crossover in rows per step moves with the hardware, so `auto` measures on the sweep's own first masks:

  the sweep's first groups have 1, 2, 4, 8, 16 masks (the real work of the sweep: nothing is decoded twice), each
  timed; the group size keeps doubling while the time per mask falls (by more than GAIN), and the sweep then runs on
  the best size measured. When the caller says how many rows one mask's beam search has (`rows`: sentences of the
  largest batch x beam), the walk starts at the measured crossover's guess (ROWS_PER_SEARCH rows a search) instead
  of at 1: on a small set groups of 1, 2 and 4 masks are sure losses, and a walk from one size below the guess
  loses measurably against the best fixed size (results/benchmarks/sweep-speed.txt). A larger size is tried only
  while the sweep has at least PROBE_SPAN groups of it left, so that a probe that loses costs a small share of the
  sweep (a size past the best costs more per output word, and on a short sweep one group of it is a large share
  of the sweep). The first groups of a single-head sweep hold its encoder self-attention masks,
  which cost more than the others (each runs its own encoder pass): the walk compares sizes on alike masks.
  Times are CPU seconds of the decoding process (one thread), not wall time, so that other processes' load does
  not decide; they are normalised by the output each group decoded (hypothesis words plus one end of sentence per
  sentence), so that groups of masks that decode longer hypotheses (heavily pruned models run to the length cap)
  are not mistaken for slower sizes.

Hypotheses do not depend on the choice (SubsetEvaluator.translate_many is tested identical for every size), so
neither does any BLEU, p-value or results row; the choice and its measurements are recorded beside the results.
The logic is pure (no model, no clock): callers time the groups and report them with `record`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from fairseq_headprune.errors import UserError
from fairseq_headprune.options import option
from fairseq_headprune.decoding.workers import map_tasks

CANDIDATES = (1, 2, 4, 8, 16)
# A larger size must be faster per output word than the best so far to keep doubling. No margin: stopping early
# costs the whole sweep (on a shared 2-core machine, 4 masks measured 4.9% faster than 2, then 8 was 15% faster
# than 4), while one size too many costs one group.
GAIN = 0.0
AUTO = "auto"
# Rows of one beam search (masks x sentences x beam) where sharing stops paying on the CPU this was measured on
# (results/benchmarks/sweep-speed.txt): 8 masks were best at 64 rows a mask (the demo slice, greedy: 512 rows), 1 at
# 1,110 (500 sentences at beam 5 in batches of up to 222), and 8 masks at ~700 rows were 1.3x slower than 1.
# Only where the walk starts: it still measures upwards from there (a GPU keeps doubling).
ROWS_PER_SEARCH = 512
# A size is probed only with at least this many groups of it left in the sweep: a probe 50% slower a mask then
# costs at most ~6% of what is left.
PROBE_SPAN = 8


def masks_per_batch_option():
    """The --masks-per-batch field of every study that sweeps masks (ablate, prune, compare, report): one name, one
    default, one help. A string until the study parses it (parse_masks_per_batch)."""
    return option(AUTO, flag="--masks-per-batch",
                  help="masks sharing one beam search, each sentence once per mask: auto (the default) measures 1, 2, "
                       "4, 8, 16 on the sweep's first masks and keeps the fastest; or a number >= 1")


def parse_masks_per_batch(text: Union[str, int]) -> Union[str, int]:
    """`auto`, or a whole number >= 1; anything else is a user error."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        text = str(text).strip().lower()
        if text == AUTO:
            return AUTO
        try:
            value = int(text)
        except ValueError:
            raise UserError(f"--masks-per-batch must be 'auto' or a whole number >= 1, not {text!r}") from None
    if value < 1:
        raise UserError(f"--masks-per-batch must be 'auto' or a whole number >= 1, not {value}")
    return value


def first_size(rows: int, candidates: Sequence[int] = CANDIDATES) -> int:
    """The walk's first size for beam searches of `rows` rows with one mask: the largest candidate that keeps a
    search within ROWS_PER_SEARCH rows (the smallest candidate when even one mask exceeds it)."""
    fitting = [c for c in candidates if c * max(1, rows) <= ROWS_PER_SEARCH]
    return fitting[-1] if fitting else candidates[0]


def rows_per_search(evaluator) -> int:
    """Rows of the largest beam search of one mask on the evaluator's set: sentences of its largest batch x beam."""
    return max(len(sample["id"]) for sample in evaluator.samples) * evaluator.generator.beam_size


def output_units(hypotheses: Sequence[Sequence[str]]) -> int:
    """What a group of masks decoded: words of every hypothesis plus one end of sentence per sentence."""
    return sum(len(h.split()) + 1 for hyps in hypotheses for h in hyps)


@dataclass
class Measurement:
    size: int
    seconds: float
    masks: int
    units: int

    @property
    def per_mask(self) -> float:
        return self.seconds / max(1, self.masks)

    @property
    def per_unit(self) -> float:
        return self.seconds / max(1, self.units)


@dataclass
class MaskBatching:
    """The group sizes of one sweep: fixed, or chosen by measuring the first groups (`auto`).

    Ask `next_size(remaining)` before each group (several may be in flight, e.g. on local workers), report each
    finished group with `record`. `chosen` is the size in use once settled, `reason` says why (for logs and
    result headers)."""

    option: Union[str, int] = AUTO
    candidates: Sequence[int] = CANDIDATES
    gain: float = GAIN
    rows: Optional[int] = None  # rows of one mask's largest beam search: auto starts at first_size(rows)
    measurements: Dict[int, Measurement] = field(default_factory=dict)
    dispatched: List[int] = field(default_factory=list)
    chosen: Optional[int] = None
    settled_by: str = ""
    probe_span: int = PROBE_SPAN
    unprobed: str = ""  # why the walk stopped before a size it would have tried

    def __post_init__(self):
        self.option = parse_masks_per_batch(self.option)
        if self.option != AUTO:
            self.chosen = self.option
            self.settled_by = "fixed"
        elif self.rows:
            start = first_size(self.rows, self.candidates)
            self.candidates = tuple(c for c in self.candidates if c >= start)

    @property
    def auto(self) -> bool:
        return self.option == AUTO

    def next_size(self, remaining: int) -> int:
        """The size of the next group (at most `remaining`, at least 1)."""
        remaining = max(1, remaining)
        if self.chosen is None:
            self._settle()
        if self.chosen is not None:
            return min(self.chosen, remaining)
        untried = [c for c in self.candidates if c not in self.dispatched and c > max(self.dispatched, default=0)]
        if untried and untried[0] <= remaining and (not self.dispatched or remaining >= self.probe_span * untried[0]):
            self.dispatched.append(untried[0])
            return untried[0]
        if untried and self.dispatched and not self.unprobed:
            self.unprobed = (f"{untried[0]} masks per search not tried: {remaining} masks left, fewer than "
                             f"{self.probe_span} groups of {untried[0]}")
        # the next candidate does not fit in what is left, or every candidate is in flight: the best so far
        best = self._best()
        if self.unprobed and best is not None and all(d in self.measurements for d in self.dispatched):
            self.chosen, self.settled_by = best.size, self.unprobed
            return min(best.size, remaining)
        return min(best.size if best else max(self.dispatched, default=1), remaining)

    def record(self, size: int, seconds: float, units: Optional[int] = None) -> None:
        """A finished group of `size` masks took `seconds` and decoded `units` of output (default: size)."""
        if self.chosen is not None or size in self.measurements or size not in self.dispatched:
            return  # groups after the choice, or of a size already measured, do not change it
        self.measurements[size] = Measurement(size, seconds, size, units if units else size)
        self._settle()

    def finish(self) -> None:
        """The sweep ran out of masks before the choice settled: settle on what was measured."""
        if self.chosen is None:
            best = self._best()
            self.chosen = best.size if best else 1
            self.settled_by = self.unprobed or "the sweep ended before every size was measured"

    def _best(self) -> Optional[Measurement]:
        return min(self.measurements.values(), key=lambda m: m.per_unit, default=None)

    def _settle(self) -> None:
        """Walk the candidates in order: stop at the first measured size that is not GAIN faster than the best
        smaller one; wait while a size in the walk is still unmeasured."""
        best = None
        for size in self.candidates:
            m = self.measurements.get(size)
            if m is None:
                if size in self.dispatched:
                    return  # in flight: its time decides
                if self.dispatched and size > max(self.dispatched):
                    return  # not tried yet
                continue
            if best is not None and m.per_unit > best.per_unit * (1 - self.gain):
                winner = m if m.per_unit < best.per_unit else best
                self.chosen = winner.size
                margin = f" {self.gain:.0%}" if self.gain else ""
                self.settled_by = f"{size} masks per search were not{margin} faster than {best.size}"
                return
            best = m if best is None or m.per_unit < best.per_unit else best
        if best is not None and len(self.measurements) == len(self.candidates):
            self.chosen, self.settled_by = best.size, "the largest size measured"

    def reason(self) -> str:
        """One line for logs and result files."""
        if not self.auto:
            return f"{self.chosen} masks per beam search (--masks-per-batch {self.chosen})"
        times = ", ".join(f"{m.size}: {m.per_mask:.2f} CPU s/mask, {1000 * m.per_unit:.2f} ms/output word"
                          for m in sorted(self.measurements.values(), key=lambda m: m.size))
        start = (f"; {self.rows} rows a search with one mask, so sizes from {self.candidates[0]}" if self.rows
                 else "")
        return (f"{self.chosen if self.chosen is not None else '?'} masks per beam search (auto: measured on the "
                f"sweep's first groups: {times or 'nothing measured'}; {self.settled_by or 'not settled'}{start})")

    def as_dict(self) -> dict:
        return {"option": self.option, "chosen": self.chosen, "reason": self.reason(),
                "measured": {str(m.size): {"seconds": round(m.seconds, 3), "masks": m.masks, "units": m.units}
                             for m in self.measurements.values()}}


def timed_translation(evaluator, mask_sets: Sequence[Sequence]) -> Tuple[List[List[str]], float]:
    """(hypotheses of each set, sharing beam searches; the CPU seconds this took). CPU time, not wall time: the
    choice must not follow other processes' load (on a shared machine wall times of one group vary 2x)."""
    start = time.process_time()
    hypotheses = evaluator.translate_many(mask_sets, len(mask_sets))
    return hypotheses, time.process_time() - start


def sized_groups(items: Sequence, batching: MaskBatching) -> Iterator[list]:
    """`items` in consecutive groups, each sized by `batching` when it is asked for (lazily: a group's size can
    depend on the times of the groups before it)."""
    start = 0
    while start < len(items):
        size = batching.next_size(len(items) - start)
        yield list(items[start : start + size])
        start += size


def translate_masks(evaluator, mask_sets: Sequence[Sequence], on_group: Callable[[List[int], List[List[str]]], None],
                    batching: Optional[MaskBatching] = None, pool=None) -> MaskBatching:
    """Hypotheses of every set of masked heads (SubsetEvaluator.translate_many), decoded in groups that share beam
    searches, sized by `batching` (default auto); on a `workers.Workers` pool built with
    `evaluate.translate_worker` and this evaluator's spec, or in this process. on_group(indices, hypotheses) runs
    here, in order, as each group finishes. Returns the batching, settled, to record its `reason()`."""
    batching = batching or MaskBatching()

    def on_result(group, result, seconds):
        hypotheses, cpu_seconds = result
        batching.record(len(group), cpu_seconds, output_units(hypotheses))
        on_group([i for i, _ in group], hypotheses)

    def translate_group(group, shared=None):
        return timed_translation(evaluator, [masked for _, masked in group])

    map_tasks(sized_groups(list(enumerate(mask_sets)), batching), translate_group, on_result, pool)
    batching.finish()
    return batching
