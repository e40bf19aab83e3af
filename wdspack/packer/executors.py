"""Where the pack job's tasks run: in this process, a spawn process pool, or a Ray cluster.

One function, :func:`run_tasks`, runs ``fn(*task)`` for every task and yields the results **in
task order**, while ``on_done`` fires as each task *completes* (so a progress bar moves even when
task 0 is the slow one). Two implementations sit behind it:

=========  =====================================================================================
executor   what runs the tasks
=========  =====================================================================================
``local``  this process (``workers=1``) or a spawn :class:`~concurrent.futures.ProcessPoolExecutor`
``ray``    Ray tasks (one CPU each) on the cluster ``ray_address`` names, or on a local one
=========  =====================================================================================

Tasks are submitted lazily with a bound on how many are unfinished at once, so the driver never
holds the arguments of every task of a big job, only of those in flight; finished results (small:
an index, a :class:`~wdspack.format.manifest.ShardInfo`) wait in a dict until their turn.

``fn`` must be a module-level function (it is pickled by reference). On Ray a task whose worker
dies (killed, out of memory, node lost) is retried up to ``RAY_MAX_RETRIES`` times; an exception
raised by ``fn`` itself is not retried (``retry_exceptions=False``: wdspack's errors are
deterministic — the same bytes fail the same way) and reaches the caller as the original
:class:`~wdspack.errors.WdspackError`, not wrapped.

Progress: a task calls :func:`report` per unit of work (a record measured, a sample written); the
counts reach the driver's :func:`reported` while the task runs (every ``REPORT_SECONDS``, through a
shared counter the pool's processes inherit; at once in this process), or, on Ray, with each
task's result. On a terminal the pack job draws tqdm bars; elsewhere (Slurm, ``nohup``, CI logs)
:class:`ProgressLog` prints a plain line every :func:`progress_interval` seconds
(``WDSPACK_PROGRESS_INTERVAL``, default 30), so a multi-hour job never looks hung.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, nullcontext
from multiprocessing import get_context
from typing import Any, TextIO

from ..errors import ConfigError, WdspackError

__all__ = ["EXECUTORS", "PROGRESS_INTERVAL", "RAY_MAX_RETRIES", "REPORT_SECONDS", "ProgressLog", "check_executor",
           "live_bar", "progress_interval", "report", "reported", "run_tasks", "shared_pool"]

EXECUTORS = ("local", "ray")
RAY_MAX_RETRIES = 3  # retries of a task whose worker process or node was lost
_IN_FLIGHT_PER_SLOT = 4  # unfinished tasks per parallel slot: keeps every slot busy, bounds memory

#: Seconds between plain progress lines when stderr is not a terminal (``WDSPACK_PROGRESS_INTERVAL``).
PROGRESS_INTERVAL = 30.0
#: Seconds between a pool process's progress reports to the driver (:func:`report`).
REPORT_SECONDS = 0.5

_NO_RAY = "--executor ray needs Ray, which is not installed: pip install wdspack[ray]  (or pip install 'ray>=2.9')"


def check_executor(executor: str) -> None:
    """Raise :class:`ConfigError` if ``executor`` is unknown or its engine is not installed.

    Example:
        >>> check_executor("local")
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown --executor {executor!r}; choose one of {', '.join(EXECUTORS)}")
    if executor == "ray":
        _import_ray()


def run_tasks(fn: Callable[..., Any], tasks: Iterable[tuple], *, executor: str = "local", workers: int = 1,
              ray_address: str | None = None, on_done: Callable[[], Any] | None = None) -> Iterator[Any]:
    """Yield ``fn(*task)`` for each task, in task order.

    Args:
        fn: a module-level (picklable) function.
        tasks: argument tuples; consumed lazily.
        executor: ``"local"`` or ``"ray"``.
        workers: processes of the local pool (1: run here); ignored by Ray, whose cluster's CPUs
            decide the parallelism.
        ray_address: the cluster to join (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``);
            ``None`` joins the one this process already joined, or starts a local one.
        on_done: called once per task as it completes (progress).

    Example:
        >>> list(run_tasks(divmod, [(7, 2), (9, 4)]))
        [(3, 1), (2, 1)]
    """
    check_executor(executor)
    done = on_done or (lambda: None)
    if executor == "ray":
        return _run_ray(fn, tasks, address=ray_address, on_done=done)
    return _run_local(fn, tasks, workers=workers, on_done=done)


#: The pools :func:`shared_pool` holds open, by number of workers: a getter that starts one on first use.
_SHARED: dict[int, Callable[[], ProcessPoolExecutor]] = {}


@contextmanager
def shared_pool(workers: int) -> Iterator[None]:
    """Run every local stage inside on one spawn pool of ``workers`` processes (started on first
    use, shut down on exit), so each worker pays its start-up (imports, the tokenizer and template,
    built once per process by ``get_builder``) once per job, not once per stage.

    Example:
        >>> with shared_pool(1):
        ...     list(run_tasks(divmod, [(7, 2)]))
        [(3, 1)]
    """
    if workers <= 1 or workers in _SHARED:  # nothing to share, or an outer job already shares one
        yield
        return
    pool: list[ProcessPoolExecutor] = []

    def get() -> ProcessPoolExecutor:
        if not pool:
            pool.append(_spawn_pool(workers))
        return pool[0]

    _SHARED[workers] = get
    try:
        yield
    finally:
        del _SHARED[workers]
        if pool:
            pool[0].shutdown(wait=True, cancel_futures=True)


def _run_local(fn, tasks: Iterable[tuple], *, workers: int, on_done) -> Iterator[Any]:
    tasks = iter(tasks)
    head = list(itertools.islice(tasks, 2))  # one task alone is not worth starting a pool
    if workers <= 1 or len(head) <= 1:
        for t in itertools.chain(head, tasks):
            result = fn(*t)  # report() counts straight into reported() here
            on_done()
            yield result
        return
    # a spawn pool starts its processes as tasks arrive, so a short job starts no idle ones; inside a
    # job the stages share one (shared_pool)
    shared = _SHARED.get(workers)
    with (nullcontext(shared()) if shared is not None
          else _spawn_pool(workers)) as pool:
        try:
            yield from _ordered(itertools.chain(head, tasks), lambda t: _submit(pool, _reporting, (fn, *t)),
                                _wait_local, lambda fut: fut.result(), lambda futs: [f.cancel() for f in futs],
                                limit=workers * _IN_FLIGHT_PER_SLOT, on_done=on_done)
        except BrokenProcessPool:
            if _interrupted(pool):
                raise KeyboardInterrupt from None
            raise


def _interrupted(pool: ProcessPoolExecutor) -> bool:
    """Whether a pool process was ended by Ctrl-C (:func:`_quiet_on_sigint` counts it in the pool's shared
    ``wdspack_interrupts``). A Ctrl-C that reaches this process while :func:`_submit` ignores it is lost here, and
    the pool's end is all there is to say it came."""
    interrupts = getattr(pool, "wdspack_interrupts", None)
    return interrupts is not None and interrupts.value > 0


def _spawn_pool(workers: int) -> ProcessPoolExecutor:
    interrupts = get_context("spawn").Value("i", 0, lock=False)  # set in a signal handler: no lock to wait on
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"), initializer=_start_worker,
                               initargs=(_shared_counter(), interrupts))
    pool.wdspack_interrupts = interrupts  # type: ignore[attr-defined]
    return pool


def _start_worker(counter: Any, interrupts: Any) -> None:
    """A pool process's set-up: its :func:`report` calls go to the driver's ``counter``; Ctrl-C is quiet, and
    counted in ``interrupts``."""
    global _sink
    _sink = counter
    _quiet_on_sigint(interrupts)


def _submit(pool: ProcessPoolExecutor, fn: Callable[..., Any], task: tuple) -> Any:
    """``pool.submit`` with Ctrl-C ignored while it may start a pool process: the process is born ignoring it
    (an ignored signal stays ignored across exec), so a Ctrl-C during its start-up prints no traceback."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return pool.submit(fn, *task)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return pool.submit(fn, *task)
    finally:
        signal.signal(signal.SIGINT, previous)


def _quiet_on_sigint(interrupts: Any) -> None:
    """In a pool process, once started: Ctrl-C (sent to the whole process group) ends it at once and in
    silence, counted in the driver's ``interrupts``; the job's own process says what happened, in one line (its
    work is kept for ``--resume``)."""
    import os
    import signal

    def end(*_: Any) -> None:
        interrupts.value += 1
        os._exit(130)

    signal.signal(signal.SIGINT, end)


def _wait_local(pending: list) -> list:
    return list(wait(pending, return_when=FIRST_COMPLETED)[0])


def _run_ray(fn, tasks: Iterable[tuple], *, address: str | None, on_done) -> Iterator[Any]:
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init(address=address, logging_level=logging.WARNING)
    # per-task progress: a Ray worker's report() counts come back with its result (_counted)
    remote = ray.remote(num_cpus=1, max_retries=RAY_MAX_RETRIES, retry_exceptions=False)(_counted)
    slots = max(1, int(ray.cluster_resources().get("CPU", 1)))

    def wait_ray(pending: list) -> list:
        return ray.wait(pending, num_returns=1)[0]

    def cancel(pending: list) -> None:
        for ref in pending:
            ray.cancel(ref)

    def result(ref) -> Any:
        try:
            value, count = ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # fn raised: hand back the original error
            if isinstance(e.cause, WdspackError):
                raise e.cause from None
            raise
        except ray.exceptions.RayError as e:  # worker or node lost more than RAY_MAX_RETRIES times
            raise WdspackError(f"a Ray task of {fn.__name__} failed after {RAY_MAX_RETRIES} retries "
                               f"({type(e).__name__}: {e}); finished work is kept, re-run with --resume") from e
        _count_here(count)
        return value

    named = remote.options(name=fn.__name__)  # the task's own name on the dashboard, not the wrapper's
    yield from _ordered(iter(tasks), lambda t: named.remote(fn, *t), wait_ray, result, cancel,
                        limit=slots * _IN_FLIGHT_PER_SLOT, on_done=on_done)


def _ordered(tasks: Iterator[tuple], submit, wait_some, result, cancel, *, limit: int,
             on_done) -> Iterator[Any]:
    """Keep at most ``limit`` tasks unfinished; yield results in submission order.

    ``submit(task) -> handle``; ``wait_some(handles) -> finished handles`` (at least one);
    ``result(handle) -> value`` (raises the task's error); ``cancel(handles)`` on an early exit.
    """
    handles: dict[Any, int] = {}  # unfinished handle -> task number
    ready: dict[int, Any] = {}  # finished task number -> handle
    submitted = yielded = 0
    try:
        for task in tasks:
            while len(handles) >= limit:
                _collect(handles, ready, wait_some, on_done)
            handles[submit(task)] = submitted
            submitted += 1
            while yielded in ready:
                yield result(ready.pop(yielded))
                yielded += 1
        while yielded < submitted:
            while yielded not in ready:
                _collect(handles, ready, wait_some, on_done)
            yield result(ready.pop(yielded))
            yielded += 1
    finally:
        if handles:  # an error, or the caller stopped early: leave no work running
            cancel(list(handles))


def _collect(handles: dict[Any, int], ready: dict[int, Any], wait_some, on_done) -> None:
    for h in wait_some(list(handles)):
        ready[handles.pop(h)] = h
        on_done()


def _import_ray():
    try:
        import ray
        import ray.exceptions
    except ImportError:
        raise ConfigError(_NO_RAY) from None
    return ray


# ---------------------------------------------------------------------------------------------
# Progress counts: reported inside tasks, read by the driver

_sink: Any = None  # in a pool process: the driver's shared counter (set by _start_worker)
_collecting = False  # in a Ray task: counts go back with the result (_counted)
_pending = 0  # counted in a pool process or Ray task, not yet sent
_next_send = 0.0
_here = 0  # counted in this process (tasks run here, and Ray results)
_counter: Any = None  # the shared counter pool processes send to, made with the first pool


def report(n: int = 1) -> None:
    """Inside a task: ``n`` more units of work are done (records measured, samples written).

    Cheap enough to call per record: a pool process sends its count to the driver every
    :data:`REPORT_SECONDS` and when its task ends; a task run here counts at once.

    Example:
        >>> before = reported(); report(3); reported() - before
        3
    """
    global _pending, _here
    if _sink is None and not _collecting:
        _here += n
        return
    _pending += n
    if _sink is not None and time.monotonic() >= _next_send:
        _send()


def reported() -> int:
    """Units of work reported so far by the tasks of this process's jobs (read it before and after a stage).

    Example:
        >>> isinstance(reported(), int)
        True
    """
    return _here + (_counter.value if _counter is not None else 0)


def _send() -> None:
    global _pending, _next_send
    if _pending:
        with _sink.get_lock():
            _sink.value += _pending
        _pending = 0
    _next_send = time.monotonic() + REPORT_SECONDS


def _shared_counter() -> Any:
    global _counter
    if _counter is None:
        _counter = get_context("spawn").Value("q", 0)
    return _counter


def _count_here(n: int) -> None:
    global _here
    _here += n


def _reporting(fn: Callable[..., Any], *task: Any) -> Any:
    """``fn(*task)`` in a pool process; what it reported reaches the driver before its result does."""
    try:
        return fn(*task)
    finally:
        _send()


def _counted(fn: Callable[..., Any], *task: Any) -> tuple[Any, int]:
    """``fn(*task)`` in a Ray task, with the units of work it reported."""
    global _collecting, _pending
    _collecting, _pending = True, 0
    try:
        return fn(*task), _pending
    finally:
        _collecting, _pending = False, 0


# ---------------------------------------------------------------------------------------------
# Progress shown: a bar on a terminal, a line every N seconds where no terminal draws one


def progress_interval() -> float:
    """Seconds between plain progress lines: ``$WDSPACK_PROGRESS_INTERVAL``, else :data:`PROGRESS_INTERVAL`.

    Example:
        >>> progress_interval()  # doctest: +SKIP
        30.0
    """
    text = os.environ.get("WDSPACK_PROGRESS_INTERVAL", "").strip()
    if not text:
        return PROGRESS_INTERVAL
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:  # also refuses nan
        raise ConfigError(f"WDSPACK_PROGRESS_INTERVAL={text!r}: give the seconds between progress lines, "
                          f"a positive number (default {PROGRESS_INTERVAL:g})")
    return seconds


class ProgressLog:
    """One plain line per ``interval`` seconds on ``stream`` while a stage runs, from a daemon thread
    (a slow task fires no callback, yet the log must show the job is alive)::

        wdspack measure: 12,000/40,000 records (30%), 0:00:30 elapsed, 400 records/s, ETA 0:01:10

    ``count`` (default: the :meth:`update` calls) says how far the stage is; ``total`` None (not
    known) leaves the share and the ETA out, ``estimated`` marks it ``~``. A stage shorter than
    ``interval`` prints nothing; one that printed ends with a closing line.

    Example:
        >>> log = ProgressLog("write", "shard", total=3, interval=30)
        >>> log.update(); log.close()  # under 30 s: silent
    """

    def __init__(self, desc: str, unit: str, *, total: int | None, interval: float, stream: TextIO | None = None,
                 count: Callable[[], int] | None = None, estimated: bool = False) -> None:
        self.desc, self.unit, self.total, self.interval = desc, unit, total, interval
        self.estimated = estimated
        self._updates = 0
        self._count = count
        self._stream = stream
        self._start = time.monotonic()
        self._said = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name=f"wdspack-progress-{desc}", daemon=True)
        self._thread.start()

    @property
    def done(self) -> int:
        return self._count() if self._count is not None else self._updates

    def update(self, n: int = 1) -> None:
        self._updates += n

    def close(self, *, finished: bool | None = None) -> None:
        """Stop the ticker; a stage that logged gets its last line (``finished``, default: the count
        reached the total, or where it stopped)."""
        self._stop.set()
        self._thread.join()
        if self._said:
            elapsed = time.monotonic() - self._start
            done = self.done
            if finished is None:
                finished = self.total is not None and done >= self.total
            if self.total is None or (finished and done != self.total):  # an estimate, now known
                of = ""
            else:
                of = f"/{'~' if self.estimated and not finished else ''}{self.total:,}"
            state = "done" if finished else "stopped"
            self._say(f"wdspack {self.desc}: {done:,}{of} {self.unit}s {state} in {_clock(elapsed)}")

    def line(self) -> str:
        """The progress line for now: stage, done/total, elapsed, rate, ETA."""
        elapsed = time.monotonic() - self._start
        done, total = self.done, self.total
        rate = done / elapsed if elapsed > 0 else 0.0
        head = f"wdspack {self.desc}: {done:,}"
        if total is None:
            return f"{head} {self.unit}s, {_clock(elapsed)} elapsed, {_rate(rate)} {self.unit}s/s"
        share = f" ({min(done / total, 1):.0%})" if total else ""
        eta = _clock(max(total - done, 0) / rate) if rate > 0 else "unknown"
        return (f"{head}/{'~' if self.estimated else ''}{total:,} {self.unit}s{share}, {_clock(elapsed)} elapsed, "
                f"{_rate(rate)} {self.unit}s/s, ETA {eta}")

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._said = True
            self._say(self.line())

    def _say(self, text: str) -> None:
        stream = self._stream or sys.stderr  # looked up now: a test or a wrapper may have swapped it
        print(text, file=stream, flush=True)


@contextmanager
def live_bar(desc: str, unit: str, *, total: int | None, count: Callable[[], int],
             refresh: float = REPORT_SECONDS) -> Iterator[Any]:
    """A tqdm bar on stderr that follows ``count()`` (polled every ``refresh`` seconds by a daemon
    thread, so it moves while a task runs); ``total`` None shows the count and the rate only.

    Example:
        >>> with live_bar("measure", "record", total=10, count=lambda: 10):  # doctest: +SKIP
        ...     pass
    """
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False, dynamic_ncols=True)
    stop = threading.Event()

    def follow() -> None:
        while True:
            n = count()
            if n > bar.n:
                bar.update(n - bar.n)
            if stop.wait(refresh):
                return

    thread = threading.Thread(target=follow, name=f"wdspack-bar-{desc}", daemon=True)
    thread.start()
    try:
        yield bar
    finally:
        stop.set()
        thread.join()
        bar.close()


def _rate(per_second: float) -> str:
    """``1,234`` per second, or three figures below 100 (``0.4``, ``12.5``)."""
    return f"{per_second:,.0f}" if per_second >= 100 else f"{per_second:.3g}"


def _clock(seconds: float) -> str:
    """``H:MM:SS``, as tqdm writes times."""
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
