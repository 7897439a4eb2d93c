"""`--masks-per-batch auto` told the rows of one mask's beam search: where its walk starts (pure, no model)."""
from types import SimpleNamespace

import pytest

from fairseq_headprune.decoding.mask_batching import (PROBE_SPAN, ROWS_PER_SEARCH, MaskBatching, first_size,
                                                      rows_per_search)


def walk(batching, per_mask, total=100):
    """Sizes a sweep of `total` masks asks for, each group taking per_mask[size] seconds a mask."""
    sizes = []
    while sum(sizes) < total:
        k = batching.next_size(total - sum(sizes))
        sizes.append(k)
        batching.record(k, per_mask.get(k, 9.0) * k)
    batching.finish()
    return sizes


@pytest.mark.parametrize("rows, first", [
    (64, 8),      # the demo slice, greedy: 8 masks make 512 rows
    (32, 16),     # 16 x 32 = 512
    (1, 16),      # all fit: the largest candidate
    (128, 4),     # 4 x 128 = 512
    (256, 2),     # 2 x 256 = 512
    (513, 1),     # not even one mask fits
    (1110, 1),    # 500 sentences at beam 5 in batches of 222
])
def test_first_size_is_the_crossover_guess(rows, first):
    assert first_size(rows) == first
    assert ROWS_PER_SEARCH == 512


def test_a_small_set_skips_the_sizes_that_cannot_win():
    """64 rows: the walk starts at 8, probes 16 (the sweep is long enough), then keeps the best; groups of 1, 2
    and 4 masks are never decoded."""
    b = MaskBatching("auto", rows=64)
    sizes = walk(b, {1: 2.6, 2: 2.0, 4: 1.8, 8: 1.6, 16: 1.7}, total=200)
    assert sizes[:2] == [8, 16] and set(sizes[2:-1]) == {8} and sum(sizes) == 200
    assert b.chosen == 8 and "64 rows a search with one mask, so sizes from 8" in b.reason()


def test_a_probe_needs_enough_of_the_sweep_left():
    """A size is tried only with PROBE_SPAN groups of it left: on 100 masks from 8, 16 would need 128."""
    assert PROBE_SPAN == 8
    b = MaskBatching("auto", rows=64)
    sizes = walk(b, {8: 1.6, 16: 1.0}, total=100)
    assert set(sizes[:-1]) == {8} and b.chosen == 8
    assert "16 masks per search not tried: 92 masks left, fewer than 8 groups of 16" in b.reason()
    b = MaskBatching("auto", rows=64)
    assert walk(b, {8: 1.6, 16: 1.0}, total=8 + 128)[:3] == [8, 16, 16] and b.chosen == 16


def test_the_walk_never_tries_a_size_below_its_start():
    """From its start the walk goes up only: 8 beats 16, and 1, 2 or 4 are never decoded."""
    b = MaskBatching("auto", rows=64)
    sizes = walk(b, {4: 1.0, 8: 3.0, 16: 3.5}, total=200)  # 16 loses to 8: settle on 8
    assert sizes[:2] == [8, 16] and set(sizes[2:-1]) == {8} and b.chosen == 8


def test_a_large_set_walks_from_one_and_fixed_sizes_ignore_rows():
    b = MaskBatching("auto", rows=1110)
    assert walk(b, {1: 1.0, 2: 1.3})[:3] == [1, 2, 1] and b.chosen == 1
    fixed = MaskBatching(8, rows=64)
    assert walk(fixed, {}, total=20) == [8, 8, 4] and fixed.chosen == 8
    assert MaskBatching("auto").candidates == (1, 2, 4, 8, 16)  # no rows: the walk from 1, as before


def test_rows_per_search_is_the_largest_batch_times_the_beam():
    evaluator = SimpleNamespace(samples=[{"id": list(range(222))}, {"id": list(range(97))}],
                                generator=SimpleNamespace(beam_size=5))
    assert rows_per_search(evaluator) == 1110
