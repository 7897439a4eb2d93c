"""`--masks-per-batch auto` told the rows of one mask's beam search: where its walk starts (pure, no model)."""
from types import SimpleNamespace

import pytest

from fairseq_headprune.mask_batching import ROWS_PER_SEARCH, MaskBatching, first_size, rows_per_search


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
    (64, 4),      # the demo slice, greedy: 8 masks make 512 rows, the walk starts one size below
    (32, 8),      # 16 x 32 = 512
    (1, 8),       # 16 fit: start at 8
    (128, 2),     # 4 x 128 = 512
    (256, 1),     # 2 x 256 = 512: one below is 1
    (513, 1),     # not even one mask fits
    (1110, 1),    # 500 sentences at beam 5 in batches of 222
])
def test_first_size_is_one_below_the_crossover(rows, first):
    assert first_size(rows) == first
    assert ROWS_PER_SEARCH == 512


def test_a_small_set_skips_the_sizes_that_cannot_win():
    """64 rows: the walk is 4, 8, 16, then the best; groups of 1 and 2 masks are never decoded."""
    b = MaskBatching("auto", rows=64)
    sizes = walk(b, {1: 2.6, 2: 2.0, 4: 1.8, 8: 1.6, 16: 1.7})
    assert sizes[:3] == [4, 8, 16] and set(sizes[3:-1]) == {8} and sum(sizes) == 100
    assert b.chosen == 8 and "64 rows a search with one mask, so sizes from 4" in b.reason()


def test_the_walk_never_tries_a_size_below_its_start():
    """From its start the walk goes up only: 4 beats 8, and 1 or 2 are never decoded."""
    b = MaskBatching("auto", rows=64)
    sizes = walk(b, {4: 3.0, 8: 3.5})  # 8 loses to 4: settle on 4
    assert sizes[:2] == [4, 8] and set(sizes[2:]) == {4} and b.chosen == 4


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
