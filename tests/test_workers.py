"""--masks-per-batch auto and local workers: the choice and the split never change a result."""
import pytest

from fairseq_headprune.errors import UserError
from fairseq_headprune.decoding.mask_batching import MaskBatching, parse_masks_per_batch, sized_groups, translate_masks
from fairseq_headprune.decoding.workers import Workers, map_tasks, parse_workers, resolve_workers

# ---------------------------------------------------------------- the choice, on made-up timings


def measure(batching, seconds_per_mask, total=100):
    """Run a sweep of `total` masks through `batching`, each group of k taking seconds_per_mask[k] * k."""
    sizes = []
    for group in sized_groups(list(range(total)), batching):
        k = len(group)
        sizes.append(k)
        batching.record(k, seconds_per_mask.get(k, 9.0) * k)
    batching.finish()
    return sizes


def test_auto_keeps_doubling_while_sharing_pays_then_settles_on_the_best():
    b = MaskBatching("auto")
    sizes = measure(b, {1: 2.6, 2: 2.0, 4: 1.8, 8: 1.6, 16: 1.7}, total=200)  # 16 is probed with 185 left
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[5:] == [8] * 21 + [1]
    assert b.chosen == 8 and sum(sizes) == 200
    assert "8 masks per beam search" in b.reason() and "16: 1.70 CPU s/mask" in b.reason()


def test_auto_stops_at_the_first_size_that_does_not_pay():
    b = MaskBatching("auto")
    sizes = measure(b, {1: 14.0, 2: 18.0, 4: 1.0})  # 4 would be faster, but 2 already lost: 4 is never tried
    assert sizes[:2] == [1, 2] and set(sizes[2:]) == {1} and b.chosen == 1
    b = MaskBatching("auto", gain=0.05)
    sizes = measure(b, {1: 2.0, 2: 1.95, 4: 1.0})  # with a 5% margin, 2.5% faster does not keep doubling
    assert sizes[:3] == [1, 2, 2] and b.chosen == 2  # ... but the best size measured is the one used
    b = MaskBatching("auto")
    sizes = measure(b, {1: 2.0, 2: 1.95, 4: 1.0})  # without (the default), any gain does
    assert sizes[:4] == [1, 2, 4, 8] and b.chosen == 4


def test_auto_normalises_by_output_length():
    """A later group that decodes twice the words per mask (pruned models running to the cap) is not slower."""
    b = MaskBatching("auto")
    b.next_size(100), b.record(1, 1.0, units=100)
    b.next_size(99), b.record(2, 3.0, units=400)  # 1.5 s per mask but 7.5 ms per word instead of 10
    assert b.chosen is None and b.next_size(97) == 4


def test_auto_with_groups_in_flight_and_out_of_order():
    b = MaskBatching("auto")
    assert [b.next_size(100), b.next_size(99)] == [1, 2]  # two workers start at once
    b.record(2, 3.0)  # the 2-group finishes first: nothing decided until 1 is in
    assert b.chosen is None and b.next_size(97) == 4
    b.record(1, 1.0)  # 2 was 1.5 s/mask vs 1.0: settle on 1; the 4-group in flight does not change it
    b.record(4, 0.1)
    assert b.chosen == 1 and b.next_size(93) == 1


def test_fixed_and_short_sweeps():
    b = MaskBatching(4)
    assert measure(b, {}, total=10) == [4, 4, 2] and b.chosen == 4 and "--masks-per-batch 4" in b.reason()
    b = MaskBatching("auto", probe_span=1)
    assert measure(b, {1: 3.0, 2: 1.0, 4: 0.5}, total=5) == [1, 2, 2]  # 4 does not fit in what is left
    assert b.chosen == 2 and "4 masks per search not tried: 2 masks left" in b.reason()
    b = MaskBatching("auto")
    assert measure(b, {1: 3.0, 2: 1.0}, total=5) == [1] * 5  # 2 would need 16 masks left
    assert b.chosen == 1 and "2 masks per search not tried: 4 masks left" in b.reason()


@pytest.mark.parametrize("text", ["0", "-3", "many", "2.5", ""])
def test_bad_masks_per_batch_and_workers_are_user_errors(text):
    with pytest.raises(UserError, match="--masks-per-batch"):
        parse_masks_per_batch(text)
    with pytest.raises(UserError, match="--workers"):
        parse_workers(text if text else "x")


def test_option_values():
    assert parse_masks_per_batch("AUTO") == "auto" and parse_masks_per_batch("8") == 8
    assert parse_workers("auto") == "auto" and parse_workers("3") == 3
    n, why = resolve_workers("auto")
    assert n >= 1 and "free" in why
    assert resolve_workers(2) == (2, "2 workers (--workers 2)")


# ---------------------------------------------------------------- the pool, on plain functions


def _power_setup(config):
    """A worker's handler: the task raised to config's power, with the worker's torch threads."""
    import os

    import torch

    def handle(task, shared):
        if task == "user":
            raise UserError("bad input in a worker")
        if task == "crash":
            raise ZeroDivisionError("crash in a worker")
        # a worker's OMP_NUM_THREADS is the pool's; in this process (map_tasks) it is whatever pytest was given
        return task ** config + (shared or 0), torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"), os.getpid()

    return handle


def test_a_kept_pool_serves_several_handlers_and_is_closed_at_the_end():
    from fairseq_headprune.decoding import workers

    got = []
    with workers.kept_pools():
        with workers.pool_for(3, 10, _power_setup, 2, min_tasks=1) as (first, why):
            assert first.n == 2  # three workers: this process and two spawned
            first.run(range(3), lambda t, r, s: got.append(r[0]))
        with workers.pool_for(3, 10, _power_setup, 3, min_tasks=1) as (second, why):
            assert second is first and "reused" in why
            second.run(range(3), lambda t, r, s: got.append(r[0]))
        pids = {p.pid for p in first.processes}
        assert all(p.is_alive() for p in first.processes)
    assert got == [0, 1, 4, 0, 1, 8] and len(pids) == 2
    assert not any(p.is_alive() for p in first.processes)


def _slow_setup(seconds):
    """A handler whose build takes `seconds` (a worker importing and loading a model) and whose tasks take 0.3 s
    each, as the parent's own (an instant worker would answer before the parent ever finds nothing to receive, and
    take every task on a loaded machine); tasks say who ran them."""
    import os
    import time

    time.sleep(seconds)

    def handle(task, shared):
        time.sleep(0.3)
        return task, os.getpid()

    return handle


def test_this_process_works_while_the_workers_start_and_with_them_after():
    """The parent is one of the workers: tasks are not queued behind a worker that is still loading, and once the
    worker is ready both take tasks; results stay in task order."""
    import os
    import time

    with Workers(1, _slow_setup, 3.0) as pool:
        early = []
        pool.run(range(6), lambda t, r, s: early.append(r), local=lambda task, shared: (task, os.getpid()))
        assert early == [(t, os.getpid()) for t in range(6)]  # done here, long before the worker's 3 s build
        while not pool.built:
            pool._handle(pool._receive(), {}, {}, [0])
        later = []

        def slow_local(task, shared):
            time.sleep(0.3)
            return task, os.getpid()

        pool.run(range(12), lambda t, r, s: later.append(r), local=slow_local)
        assert [t for t, _ in later] == list(range(12))
        assert {pid for _, pid in later} == {os.getpid(), pool.processes[0].pid}


def test_pool_reports_a_crash_with_its_traceback():
    with pytest.raises(RuntimeError, match="ZeroDivisionError: crash in a worker"):
        with Workers(1, _power_setup, 1) as pool:
            pool.run([1, "crash", 2], lambda *a: None)


@pytest.fixture(scope="module")
def two_workers():
    """The module's later tests share one pool of two worker processes, kept as the report keeps its pool for all
    its parts (workers.kept_pools; the test above checks that mechanism): each process starts once (about 5 CPU s
    of imports) and builds every handler sent to it. A test that breaks the pool runs last."""
    from fairseq_headprune.decoding import workers

    with workers.kept_pools():
        with workers.pool_for(2, 2, _power_setup, 2, min_tasks=1) as (pool, why):
            assert pool is not None and pool.n == 1 and "kept for the next sweeps" in why  # and this process
        yield pool


# ---------------------------------------------------------------- on a real (tiny) model


@pytest.fixture(scope="module")
def evaluator(tiny_data, stock_checkpoint):
    """The tiny model's test set at beam 3, several batches, loaded as every command loads it."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_headprune.decoding.evaluate import SubsetEvaluator
    from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR, load

    parser = options.get_generation_parser(default_task="translation_headprune")
    args = options.parse_args_and_arch(parser, input_args=[
        "--user-dir", PACKAGE_DIR, str(tiny_data), "--path", str(stock_checkpoint), "--gen-subset", "test",
        "--beam", "3", "--max-tokens", "1200"])
    evaluator = SubsetEvaluator(load(convert_namespace_to_omegaconf(args)), "test")
    assert len(evaluator.samples) > 1
    return evaluator


def _masks():
    from fairseq_headprune.core.heads import Head

    heads = [Head("enc-self", 2, 3), Head("enc-dec", 3, 2), Head("dec-self", 1, 4), Head("enc-dec", 1, 1),
             Head("dec-self", 3, 2), Head("enc-self", 4, 8), Head("enc-dec", 2, 4)]
    return [[h] for h in heads] + [heads[:3], [Head("enc-self", 1, h) for h in range(1, 9)], []]


def test_auto_and_two_workers_give_the_hypotheses_of_one_decode_per_mask(evaluator, two_workers):
    """The auto choice and the split over two local workers change nothing: the same hypotheses, every mask
    once, in order, and so the same BLEU and p-values."""
    from fairseq_headprune.decoding.evaluate import translate_worker
    from fairseq_headprune.stats import BleuBootstrap

    masks = _masks()
    fixed = evaluator.translate_many(masks, 1)
    assert len({tuple(h) for h in fixed}) > len(masks) // 2, "the masks must change the output"

    def collect(into):
        return lambda indices, hyps: into.extend(zip(indices, hyps))

    auto = []
    batching = translate_masks(evaluator, masks, collect(auto), MaskBatching("auto", probe_span=1))
    assert batching.chosen in (1, 2, 4, 8, 16) and len(batching.measurements) >= 2
    from fairseq_headprune.decoding.workers import pool_for

    with pool_for(2, len(masks), translate_worker, evaluator.spec) as (pool, why):
        assert pool is two_workers and "reused" in why
        split = []
        translate_masks(evaluator, masks, collect(split), MaskBatching("auto"), pool)
        split_fixed = []
        translate_masks(evaluator, masks, collect(split_fixed), MaskBatching(3), pool)
    for got in (auto, split, split_fixed):
        assert [i for i, _ in got] == list(range(len(masks)))
        assert [h for _, h in got] == fixed
    boot = BleuBootstrap(evaluator.references, fixed[-1], samples=200)
    assert [boot.test(h).p_value for _, h in split] == [boot.test(h).p_value for h in fixed]


# ---------------------------------------------------------------- the sweeps, through the commands


def _sweep_rows(data, checkpoint, out, *extra):
    from conftest import run

    from fairseq_headprune.records.log import read_log

    run(["fairseq-headprune", "ablate", data, "--path", checkpoint, "--results-dir", out, "--gen-subset", "test",
         "--beam", "2", "--max-tokens", "400", "--types", "enc-dec", *extra])
    return read_log(str(out / f"ablation-{'single' if 'keep-one' not in extra else 'keep-one'}"
                              f"{'-loss' if 'loss' in extra else ''}.jsonl"))


@pytest.mark.parametrize("mode", [["--mode", "single"], ["--mode", "keep-one", "--metric", "loss"]])
def test_a_sweep_on_two_workers_or_auto_batching_writes_the_rows_of_one_process(tiny_slice, stock_checkpoint,
                                                                                 tmp_path, mode, two_workers):
    """Every row once, in job order, equal to the rows of one process decoding one mask per beam search
    (hypotheses, BLEU, p-values, NLL); the header says how each run batched and split the masks."""
    runs = {name: _sweep_rows(tiny_slice, stock_checkpoint, tmp_path / name, *mode, *extra)  # 48 sentences
            for name, extra in [("one", ["--masks-per-batch", "1", "--workers", "1"]),
                                ("auto", ["--workers", "1"]),
                                ("two", ["--workers", "2"]),
                                ("two-fixed", ["--workers", "2", "--masks-per-batch", "3"])]}
    (header, rows) = runs["one"]
    assert len(rows) == 13 and len({r["key"] for r in rows}) == 13  # the baseline and 12 enc-dec masks
    if mode[1] == "single":
        assert any(r.get("significant") for r in rows) or any(r["p_value"] < 1 for r in rows[1:])
    for name, (h, r) in runs.items():
        if mode[1] == "single":
            assert r == rows, name
        else:  # NLL rows: equal to float32 summation order (in a full test session, a worker's forward can differ
            # from this process's in the last bits, ~1e-8 relative; the head each layer keeps is the same)
            assert [{k: v for k, v in x.items() if k not in ("nll", "delta")} for x in r] == \
                [{k: v for k, v in x.items() if k not in ("nll", "delta")} for x in rows], name
            for x, y in zip(r, rows):
                for key, rel in (("nll", 1e-6), ("delta", 1e-5)):
                    if y.get(key) is None:
                        assert x.get(key) is None, name
                    else:
                        assert x[key] == pytest.approx(y[key], rel=rel, abs=1e-6), name
        assert len(h["runs"]) == 1 and h["runs"][0]["masks"] == 12
    assert "2 workers (--workers 2)" in runs["two"][0]["runs"][0]["workers"]
    assert "1 worker (--workers 1)" in runs["auto"][0]["runs"][0]["workers"]
    if mode[1] == "single":
        assert runs["auto"][0]["runs"][0]["masks_per_batch"]["option"] == "auto"
        assert runs["auto"][0]["runs"][0]["masks_per_batch"]["chosen"] in (1, 2, 4, 8, 16)
        assert runs["two-fixed"][0]["runs"][0]["masks_per_batch"]["chosen"] == 3


@pytest.mark.parametrize("value", ["0", "some", "-2"])
def test_bad_workers_and_masks_per_batch_are_one_line(tiny_data, stock_checkpoint, tmp_path, value):
    from conftest import run

    for option in ("--workers", "--masks-per-batch"):
        for command in ("ablate", "prune", "report"):
            proc = run(["fairseq-headprune", command, tiny_data, "--path", stock_checkpoint, "--results-dir",
                        tmp_path / "out", "--gen-subset", "test", option, value], check=False)
            assert proc.returncode == 2, (command, option, proc.stderr)
            assert proc.stderr.count("\n") == 1 and option in proc.stderr, proc.stderr


# ---------------------------------------------------------------- the shared pool, broken last


def test_pool_returns_every_result_once_in_task_order_from_one_thread_workers(two_workers):
    got = []
    pool = two_workers  # last of the module: the user error ends a worker
    power = pool.prepare(_power_setup, 2)
    pool.run(range(12), lambda task, result, seconds: got.append((task, result)), shared=1, handler=power)
    assert [t for t, _ in got] == list(range(12))
    assert [r[0] for _, r in got] == [t * t + 1 for t in range(12)]
    assert {r[1:] for _, r in got} == {(1, "1", pool.processes[0].pid)}  # one thread; no `local`: the worker alone
    with pytest.raises(UserError, match="bad input in a worker"):
        pool.run(["user"], lambda *a: None, handler=power)
    local = []
    map_tasks(range(12), _power_setup(2), lambda task, result, seconds: local.append((task, result[0])), shared=1)
    assert local == [(t, r[0]) for t, r in got]
