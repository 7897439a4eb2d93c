"""Local worker processes for sweeps: a sweep's tasks split over N processes of one thread each.

    with Workers(n, setup, config) as pool:         # spawns n processes; each runs handler = setup(config) once
        pool.run(tasks, on_result, shared=..., local=setup(config))   # handler(task, shared) in some worker (the
                                                     # parent too, with `local`), on_result in the parent

`setup` is a module-level function (it is pickled by name) that builds the worker's handler from a picklable study
configuration, typically by loading the model once; `tasks` is any iterable, pulled lazily whenever a worker is
free (a generator can size the next task from the results seen so far); `on_result(task, result, seconds)` runs in
the parent, in task order, whatever order the workers finish in, so the parent is the results file's only writer
and writes the rows in the order one process would. `shared` reaches every worker once per run (e.g. the baseline a
sweep compares against). `run_tasks` runs the same loop in this process when there is no pool (`--workers 1`).
The sweeps (`pool_for`, `map_tasks`) count the parent as one of their `--workers`: it decodes too, from the first
task on, while the spawned processes import torch and fairseq and load the model (the seconds that one worker would
otherwise wait through).

Workers are spawned (never forked: torch and fairseq state does not survive a fork), start with OMP_NUM_THREADS=1
and torch.set_num_threads(1), and are stopped when the block ends, whether it ends normally or not. A task that
raises stops the run: a UserError keeps its one-line message, anything else carries the worker's traceback; a
worker that dies (killed, out of memory) is reported with its exit code.

`--workers` defaults to the free cores (`free_cores`): the CPU's idle share over half a second, times the cores
this process may use, at least 1.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import queue
import time
import traceback
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional, Tuple

from fairseq_headprune.errors import UserError
from fairseq_headprune.options import option
from fairseq_headprune.fairseq_io.fairseq_errors import user_message

AUTO = "auto"


def workers_option():
    """The --workers field of every study that sweeps masks: one name, one default, one help (parse_workers)."""
    return option(AUTO, flag="--workers",
                  help="local worker processes the masks are split over, one thread each (auto: the free cores; 1: "
                       "this process only); results are the same")


def parse_workers(text) -> Any:
    """`auto` (the free cores) or a whole number >= 1."""
    if text is None or str(text).strip().lower() == AUTO:
        return AUTO
    try:
        value = int(str(text).strip())
    except ValueError:
        raise UserError(f"--workers must be 'auto' or a whole number >= 1, not {text!r}") from None
    if value < 1:
        raise UserError(f"--workers must be 'auto' or a whole number >= 1, not {value}")
    return value


def _cpu_times() -> Tuple[int, int]:
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return idle, sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)


def free_cores(sample_seconds: float = 0.5) -> Tuple[int, str]:
    """(cores that are free now, how that was measured): the machine's idle share over `sample_seconds` times its
    cores, rounded, at most the cores this process may run on, at least 1."""
    allowed = len(os.sched_getaffinity(0))
    total_cpus = os.cpu_count() or allowed
    try:
        idle0, all0 = _cpu_times()
        time.sleep(sample_seconds)
        idle1, all1 = _cpu_times()
    except OSError:  # no /proc/stat: not Linux
        return allowed, f"{allowed} usable cores (load not measurable here)"
    idle_share = (idle1 - idle0) / max(1, all1 - all0)
    free = max(1, min(allowed, round(idle_share * total_cpus)))
    return free, (f"{idle_share * total_cpus:.1f} of {total_cpus} CPUs idle over {sample_seconds:g} s, "
                  f"{allowed} usable: {free} free")


def resolve_workers(option) -> Tuple[int, str]:
    """The number of workers for `--workers OPTION`, and why."""
    option = parse_workers(option)
    if option == AUTO:
        n, why = free_cores()
        return n, f"{n} worker{'s' * (n != 1)} (--workers auto: {why})"
    return option, f"{option} worker{'s' * (option != 1)} (--workers {option})"


def run_tasks(tasks: Iterable, handler: Callable[[Any, Any], Any], on_result: Callable[[Any, Any, float], None],
              shared: Any = None) -> None:
    """The pool's loop in this process: handler(task, shared), then on_result(task, result, seconds)."""
    for task in tasks:
        start = time.perf_counter()
        result = handler(task, shared)
        on_result(task, result, time.perf_counter() - start)


def _describe(error: BaseException) -> Tuple[bool, str]:
    message = user_message(error)  # a UserError, or fairseq's own failure on the user's input
    if message is not None:
        return True, message
    return False, "".join(traceback.format_exception(type(error), error, error.__traceback__))


def _die_with_parent() -> None:
    """Have the kernel kill this process when the process that spawned it dies, however it dies (SIGKILL
    included): a worker never outlives the command, or the test run, that started it (Linux; elsewhere the
    worker's own check of its parent below is the only one)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_main(index: int, inbox, outbox, parent: int) -> None:
    """A worker: one thread; each handler built once, when its (setup, config) first arrives; tasks until told to
    stop."""
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(0)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    handlers, shared = {}, {}
    outbox.put(("ready", index, None, None))
    while True:
        try:
            message = inbox.get(timeout=5.0)
        except queue.Empty:
            if os.getppid() != parent:  # the parent died without stopping us: no more tasks; exit without waiting
                os._exit(0)  # to flush results nobody will read (a full pipe would block a normal exit forever)
            continue
        kind = message[0]
        if kind == "stop":
            return
        if kind == "handler":  # (key, setup, config): built now, so that loading overlaps the parent's work
            _, key, setup, config = message
            try:
                handlers[key] = setup(config)
            except BaseException as e:  # noqa: B036 - reported to the parent, which stops the run
                outbox.put(("error", index, None, _describe(e)))
                return
            outbox.put(("built", index, None, key))
            continue
        if kind == "shared":
            shared[message[1]] = message[2]
            continue
        _, task_id, key, task = message
        start = time.perf_counter()
        try:
            result = handlers[key](task, shared.get(key))
        except BaseException as e:  # noqa: B036
            outbox.put(("error", index, task_id, _describe(e)))
            return
        outbox.put(("result", index, task_id, (result, time.perf_counter() - start)))


class _TaskFeed:
    """A run's tasks, pulled lazily and numbered in order; `exhausted` once the last has been taken."""

    def __init__(self, tasks: Iterable):
        self.tasks = iter(tasks)
        self.next_id = 0
        self.exhausted = False

    def take(self) -> Optional[Tuple[int, Any]]:
        """(task id, task), or None when there are no more tasks."""
        try:
            task = next(self.tasks)
        except StopIteration:
            self.exhausted = True
            return None
        self.next_id += 1
        return self.next_id - 1, task


def _run_local(local: Callable[[Any, Any], Any], feed: _TaskFeed, shared: Any, finished: dict) -> None:
    """This process handles the next task itself, if there is one; its result joins `finished`."""
    taken = feed.take()
    if taken is not None:
        start = time.perf_counter()
        result = local(taken[1], shared)
        finished[taken[0]] = (taken[1], result, time.perf_counter() - start)


@contextlib.contextmanager
def _one_torch_thread(active: bool) -> Iterator[None]:
    """When `active`, torch runs one thread in this process for the duration, as the workers do."""
    if not active:
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class Workers:
    """N spawned worker processes of one thread each (see the module docstring). A pool serves any number of
    (setup, config) handlers, each built once per worker when first used (`prepare`), so one pool can run the
    sweeps of several studies: the processes start once and keep what their handlers loaded."""

    def __init__(self, n: int, setup: Optional[Callable[[Any], Callable[[Any, Any], Any]]] = None,
                 config: Any = None):
        import multiprocessing

        if n < 1:
            raise ValueError("at least one worker")
        ctx = multiprocessing.get_context("spawn")
        self.n = n
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(n)]
        self.processes = []
        self.handlers: dict = {}  # key -> (setup, config) sent to every worker
        self.built: set = set()  # (worker, key): that worker has built that handler and takes its tasks
        self.default = None
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # the children's environment, read before torch starts its threads
        try:
            for i in range(n):
                p = ctx.Process(target=_worker_main, args=(i, self.inboxes[i], self.outbox, os.getpid()),
                                name=f"fairseq-headprune-worker-{i}", daemon=True)
                p.start()
                self.processes.append(p)
            _open.add(self)
        except BaseException:
            self.close(force=True)
            raise
        finally:
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        if setup is not None:
            self.default = self.prepare(setup, config)

    def prepare(self, setup: Callable[[Any], Callable[[Any, Any], Any]], config: Any):
        """Have every worker build `setup(config)` (once per pool); returns the handler's key for `run`."""
        import pickle

        key = (f"{setup.__module__}.{setup.__qualname__}", pickle.dumps(config))
        if key not in self.handlers:
            self.handlers[key] = (setup, config)
            for inbox in self.inboxes:
                inbox.put(("handler", key, setup, config))
        return key

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, kind, error, tb) -> None:
        self.close(force=kind is not None)

    def _receive(self):
        while True:
            try:
                return self.outbox.get(timeout=1.0)
            except queue.Empty:
                dead = [(i, p.exitcode) for i, p in enumerate(self.processes) if not p.is_alive()]
                if dead:
                    i, code = dead[0]
                    raise RuntimeError(f"worker {i} exited with code {code} (killed? out of memory?)") from None

    def run(self, tasks: Iterable, on_result: Callable[[Any, Any, float], None], shared: Any = None,
            handler=None, local: Optional[Callable[[Any, Any], Any]] = None) -> None:
        """Each task handled by a free worker with `handler` (a key from `prepare`; default: the pool's own),
        on_result(task, result, seconds) in the parent, in task order.

        `local` (the same computation in this process, e.g. the handler `setup(config)` would build): this process
        is one more worker. It works from the first task on, while the workers still import and load, and each
        worker is sent tasks only once its handler is built, two at a time, so that it never waits for this
        process to finish a task of its own before it gets the next one. This process then runs one torch thread,
        as the workers do."""
        key = handler if handler is not None else self.default
        if key is None:
            raise ValueError("no handler: give Workers a setup or prepare() one")
        for inbox in self.inboxes:
            inbox.put(("shared", key, shared))
        depth = 2 if local is not None else 1  # tasks in flight per worker
        feed = _TaskFeed(tasks)
        in_flight, finished = {}, {}  # task id -> (worker, task); task id -> (task, result, seconds)
        load = [0] * self.n  # tasks in flight per worker
        next_out = 0
        with _one_torch_thread(local is not None):
            while True:
                self._dispatch(key, depth, feed, in_flight, load)
                if feed.exhausted and not in_flight:
                    self._flush(finished, next_out, on_result)
                    return
                message = self._poll()
                if message is None and local is not None and not feed.exhausted:
                    _run_local(local, feed, shared, finished)
                else:  # a worker's message, or nothing this process can do but wait for one
                    self._handle(message if message is not None else self._receive(), in_flight, finished, load)
                next_out = self._flush(finished, next_out, on_result)

    def _dispatch(self, key, depth: int, feed: "_TaskFeed", in_flight: dict, load: list) -> None:
        """Send the next tasks to every worker that has built handler `key`, up to `depth` in flight each."""
        for worker in range(self.n):
            while not feed.exhausted and load[worker] < depth and (worker, key) in self.built:
                taken = feed.take()
                if taken is None:
                    break
                self.inboxes[worker].put(("task", taken[0], key, taken[1]))
                in_flight[taken[0]] = (worker, taken[1])
                load[worker] += 1

    def _poll(self):
        try:
            return self.outbox.get_nowait()
        except queue.Empty:
            return None

    def _handle(self, message, in_flight, finished, load) -> None:
        kind, worker, task_id, body = message
        if kind == "built":
            self.built.add((worker, body))
            return
        if kind == "ready":
            return
        if kind == "error":
            self.broken = True
            user_error, text = body
            if user_error:
                raise UserError(text)
            raise RuntimeError(f"worker {worker} failed:\n{text}")
        result, seconds = body
        _, task = in_flight.pop(task_id)
        load[worker] -= 1
        finished[task_id] = (task, result, seconds)

    @staticmethod
    def _flush(finished, next_out, on_result) -> int:
        while next_out in finished:
            on_result(*finished.pop(next_out))
            next_out += 1
        return next_out

    broken = False  # a worker failed: the pool is not reused

    def close(self, force: bool = False) -> None:
        _open.discard(self)
        if not force:
            for inbox in self.inboxes:
                try:
                    inbox.put(("stop",))
                except (OSError, ValueError):
                    pass
            for p in self.processes:
                p.join(timeout=30)
        for p in self.processes:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for q in [self.outbox, *self.inboxes]:
            q.cancel_join_thread()  # a message nobody will read must not block this process's exit
            q.close()


_open: "weakref.WeakSet[Workers]" = weakref.WeakSet()  # pools not closed yet


@atexit.register
def close_all() -> None:
    """Stop every pool still open (one left by an interrupted block, a test's fixture): at this process's exit,
    and from the test suite's end."""
    for pool in list(_open):
        pool.close(force=True)


def map_tasks(tasks: Iterable, handler: Callable[[Any, Any], Any], on_result: Callable[[Any, Any, float], None],
              pool: Optional[Workers] = None, shared: Any = None) -> None:
    """`pool.run` with this process as one more worker running `handler` when there is a pool, else the loop in
    this process alone."""
    if pool is None:
        run_tasks(tasks, handler, on_result, shared)
    else:
        pool.run(tasks, on_result, shared, local=handler)  # this process is one of the workers


MIN_TASKS = 8  # fewer masks than this run in the sweep's own process: a worker's start-up (~5 s) would not pay
_kept: Optional[dict] = None  # inside kept_pools(): number of workers -> a pool kept for later sweeps


@contextlib.contextmanager
def kept_pools() -> Iterator[None]:
    """Pools started inside this block are kept for every later sweep in it (the report's parts): their processes
    start once and keep the models their handlers loaded. Closed when the block ends."""
    global _kept
    if _kept is not None:  # nested: the outer block keeps them
        yield
        return
    _kept = {}
    try:
        yield
    finally:
        pools, _kept = list(_kept.values()), None
        for pool in pools:
            pool.close()


@contextlib.contextmanager
def pool_for(option, n_tasks: int, setup: Callable[[Any], Callable[[Any, Any], Any]], config: Any,
             min_tasks: int = MIN_TASKS) -> Iterator[Tuple[Optional[Workers], str]]:
    """(a pool for the `--workers` number of workers, ready with the handler setup(config), or None to run in this
    process; why), for a sweep of `n_tasks` masks. This process is one of the workers (`map_tasks`), so N workers
    spawn N - 1 processes. One worker, or fewer than `min_tasks` masks, means this process alone.
    Inside kept_pools() the pool is reused by later sweeps (down to 2 masks) and closed at the end of that block."""
    if n_tasks < 2 or (n_tasks < min_tasks and not _kept):  # a kept pool has nothing left to start
        yield None, f"one process ({n_tasks} masks to do, fewer than {min_tasks if not _kept else 2})"
        return
    n, why = resolve_workers(option)
    n = min(n, n_tasks)
    if n <= 1:
        yield None, why
        return
    if _kept is None:
        with Workers(n - 1, setup, config) as pool:
            yield pool, why
        return
    pool = _kept.get(n)
    if pool is not None and pool.broken:
        pool.close(force=True)
        pool = None
    if pool is None:
        pool = _kept[n] = Workers(n - 1)
    pool.default = pool.prepare(setup, config)
    try:
        yield pool, why + (" (kept for the next sweeps)" if len(pool.handlers) == 1 else " (reused)")
    except BaseException:
        pool.broken = True
        raise
