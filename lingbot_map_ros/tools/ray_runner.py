"""Many sequences or recordings on the workers of a Ray cluster (``--ray`` of ``lingbot_map_benchmark``
and ``lingbot_map_batch``): the same per-item function as the serial loop, another scheduler.

Why workers that live across items (Ray actors), one per GPU, and not one Ray task per item: the
model is built once per worker, not once per sequence (with the full preset on a GPU that is the
weights, ``torch.compile`` and CUDA-graph capture: many seconds, against a few seconds of work for a
short sequence), and each worker runs its items one after the other with one ``SessionManager``,
exactly as the serial loop does, so a sequence gives the same numbers wherever it runs. The driver
hands the next item to whichever worker is free (long and short sequences balance themselves).

Faults are handled here, not by Ray's automatic retries, because the outcome must be one line in
the table: a worker that dies (its node removed, killed for memory) or raises loses its item, which
goes to another worker; after ``--ray-retries`` further attempts the item fails with the last
reason and the others still finish. A lost worker is replaced when the cluster has room. An item
that fails on its own terms (a corrupt sequence: a one-line reason from the item's function) is
not retried: it would fail the same way on every worker.

Results land in the output folder, which every node must see at the same path (a shared file
system); the items' own resume rules (a finished sequence's ``metrics.json``) work unchanged.
Nothing here imports Ray before ``--ray`` is used: Ray is an optional extra.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .cli import UsageError, one_line

RAY_MISSING = "--ray needs Ray: pip install 'lingbot_map_ros[ray]' (tested: ray 2.60.0)"
BOARD_NAMESPACE = "lingbot_map_ros"
POLL_SECONDS = 0.5  # how often the driver looks at the workers' progress while it waits
# With no worker alive, how long the driver waits for one to be placed (a cluster without a free GPU,
# an autoscaler adding a node) before the items left fail with that reason.
PLACEMENT_TIMEOUT = 300.0
REPORT_SECONDS = 0.5  # how often a worker sends its frame count


def add_ray_options(parser: argparse.ArgumentParser) -> None:
    """``--ray [ADDRESS|auto]`` and the worker shape; nothing here needs Ray installed."""
    g = parser.add_argument_group("many GPUs through Ray (README: Many recordings on many GPUs)")
    g.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS|auto",
                   help="run the items on Ray workers: ADDRESS of a running cluster (what 'ray start --head' "
                   "prints), 'auto' (the cluster this machine belongs to), or no value: a Ray instance started "
                   "for this run on this machine (its GPUs)")
    g.add_argument("--ray-workers", type=int, default=0,
                   help="workers, each keeping one model (default: 0 = as many as the cluster's GPUs allow, or "
                   "its CPUs with --ray-gpus 0)")
    g.add_argument("--ray-gpus", type=float, default=1.0, help="GPUs per worker (0: CPU workers)")
    g.add_argument("--ray-cpus", type=float, default=1.0, help="CPUs per worker")
    g.add_argument("--ray-retries", type=int, default=2,
                   help="further attempts of an item whose worker died or raised (a node lost, out of memory)")


def check_ray_args(args: argparse.Namespace) -> None:
    if args.ray_workers < 0 or args.ray_gpus < 0 or args.ray_cpus < 0 or args.ray_retries < 0:
        raise UsageError("--ray-workers, --ray-gpus, --ray-cpus and --ray-retries must be >= 0")
    if args.ray_gpus == 0 and args.ray_cpus == 0:
        raise UsageError("--ray-gpus 0 and --ray-cpus 0: a worker must ask for a GPU or a CPU")


def connect(address: str):
    """``(ray, started_here)``: connected to the cluster at ``address`` (or a new local instance for
    ``local``); a driver that is connected already (a test, a notebook) is used as it is."""
    try:
        import ray
    except ImportError:
        raise UsageError(RAY_MISSING) from None
    if ray.is_initialized():
        return ray, False
    _check_reachable(address)
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        if address == "local":
            ray.init(include_dashboard=False, logging_level=logging.WARNING)
        else:
            ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError, OSError) as exc:
        if address == "local":
            raise UsageError(f"--ray: cannot start Ray on this machine ({one_line(str(exc), 200)}); a long TMPDIR "
                             "breaks its sockets: set RAY_TMPDIR to a short folder") from None
        raise UsageError(f"--ray {address}: no Ray cluster there ({one_line(str(exc), 200)}); start one with "
                         "'ray start --head' and give the address it prints") from None
    finally:
        # ray.init makes SIGTERM exit at once; the tool's own handler (an interrupt that keeps what
        # finished and says how to resume) stays in charge
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)
    return ray, True


def _check_reachable(address: str) -> None:
    """A ``HOST:PORT`` with nothing listening fails here at once; ``ray.init`` would retry for minutes."""
    import socket

    host, _, port = address.rpartition(":")
    if address in ("local", "auto") or "://" in address or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as exc:
        raise UsageError(f"--ray {address}: no Ray cluster there ({exc.strerror or exc}); start one with "
                         "'ray start --head' and give the address it prints") from None


def _option(args: argparse.Namespace) -> str:
    return "--ray" if args.ray == "local" else f"--ray {args.ray}"


# ------------------------------------------------------------------------------------ the workers' side
class ProgressBoard:
    """Frames done per item, reported by the workers, read by the driver (a Ray actor without CPU)."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}

    def started(self, key: str, frames: int, node: str) -> None:
        previous = self.items.get(key, {})
        self.items[key] = {"frames": frames, "done": 0, "node": node, "attempt": previous.get("attempt", 0) + 1,
                           "running": True}

    def advanced(self, key: str, done: int) -> None:
        if key in self.items:
            self.items[key]["done"] = done

    def finished(self, key: str) -> None:
        if key in self.items:
            self.items[key]["running"] = False

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return self.items


class _RemoteBar:
    """The per-item bar a worker hands to the item's function: counts frames, tells the board every
    ``REPORT_SECONDS`` (fire and forget: a slow board never slows the model)."""

    def __init__(self, board, key: str, total: int, node: str) -> None:
        self.board, self.key, self.count = board, key, 0
        self._last = 0.0
        board.started.remote(key, total, node)

    def __enter__(self) -> "_RemoteBar":
        return self

    def __exit__(self, *exc) -> None:
        self.board.advanced.remote(self.key, self.count)

    def update(self, n: int = 1, extra: str = "") -> None:
        self.count += n
        now = time.monotonic()
        if now - self._last >= REPORT_SECONDS:
            self._last = now
            self.board.advanced.remote(self.key, self.count)

    def write(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        self.__exit__()


class Worker:
    """One Ray worker: builds the item runner once (``make_runner()``), then runs items one at a time.

    ``make_runner`` is a picklable factory (``functools.partial`` of a runner class); the runner's
    ``run(*item, progress=...)`` is the very function the serial loop calls."""

    def __init__(self, make_runner: Callable[[], Any], board) -> None:
        import ray

        self.runner = make_runner()
        self.board = board
        self.node = ray.get_runtime_context().get_node_id()
        self.gpus = [str(g) for g in ray.get_gpu_ids()]
        self.model_seconds: Optional[float] = None  # building the model, once (a runner with a session)
        self.items: list[tuple[str, float]] = []  # (item, seconds on this worker), in the order run

    def ready(self) -> str:
        return self.node

    def run(self, key: str, item: tuple) -> Any:
        def progress(total: int, label: str) -> _RemoteBar:
            return _RemoteBar(self.board, key, total, self.node)

        start = time.perf_counter()
        try:
            if getattr(self.runner, "manager", False) is None:  # a model not built yet: timed on its own
                self.runner.session()
                self.model_seconds = time.perf_counter() - start
            return self.runner.run(*item, progress=progress)
        finally:
            self.items.append((key, time.perf_counter() - start))
            self.board.finished.remote(key)

    def stats(self) -> dict[str, Any]:
        """What the start-up cost and what each item took here (the first one carries the warm-up:
        compilation, CUDA-graph capture); written to ``ray_workers.json`` by the driver."""
        return {"node": self.node, "gpus": self.gpus, "model_seconds": self.model_seconds,
                "items": [{"item": k, "seconds": s} for k, s in self.items]}


# ------------------------------------------------------------------------------------ the driver's side
@dataclass
class ItemFailed:
    """An item that could not be run after its attempts: the last reason, one line."""

    reason: str
    attempts: int


@dataclass
class PoolReport:
    """What the pool tells its caller as items end (``on_done``) and while it waits (``on_tick``)."""

    total: int
    done: int = 0
    started_at: float = field(default_factory=time.monotonic)
    board: dict[str, dict[str, Any]] = field(default_factory=dict)
    workers: int = 0


def _worker_count(ray, args: argparse.Namespace, items: int) -> int:
    if args.ray_workers:
        return min(args.ray_workers, items)
    resources = ray.cluster_resources()
    if args.ray_gpus > 0:
        fit = int(resources.get("GPU", 0) // args.ray_gpus)
        if fit == 0:
            raise UsageError(f"{_option(args)}: the cluster has no GPU ({resources.get('CPU', 0):g} CPUs); "
                             "give --ray-gpus 0 for CPU workers")
    else:
        fit = int(resources.get("CPU", 0) // max(args.ray_cpus, 1e-9))
    return max(1, min(fit, items))


def run_pool(ray, args: argparse.Namespace, make_runner: Callable[[], Any], items: list[tuple[str, tuple]],
             board_name: str, on_done: Callable[[int, Any, PoolReport], None],
             on_tick: Optional[Callable[[PoolReport], None]] = None,
             on_retry: Optional[Callable[[str, str, int], None]] = None,
             on_workers: Optional[Callable[[list[dict]], None]] = None) -> list[Any]:
    """Run ``items`` (``(key, args of runner.run)``) on workers; the result of each, in item order:
    what ``runner.run`` returned, or ``ItemFailed``. ``on_done(index, result, report)`` as each ends;
    ``on_workers(stats)`` at the end with each live worker's ``Worker.stats`` and its start-up time."""
    from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

    results: list[Any] = [None] * len(items)
    if not items:
        return results
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    target = _worker_count(ray, args, len(items))  # before anything is started: a cluster without GPUs refuses
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    try:  # on the driver's node: a worker node lost must not take the progress with it
        board = ray.remote(ProgressBoard).options(name=board_name, namespace=BOARD_NAMESPACE, num_cpus=0,
                                                  scheduling_strategy=here).remote()
        ray.get(board.snapshot.remote())
    except ValueError as exc:  # the name is taken: another run writes into the same folder
        raise UsageError(f"another run on this Ray cluster writes into the same output folder ({one_line(str(exc))})"
                         ) from None
    remote_worker = ray.remote(Worker).options(num_gpus=args.ray_gpus, num_cpus=args.ray_cpus, max_restarts=0,
                                               max_task_retries=0)
    report = PoolReport(total=len(items))
    starting: dict[Any, Any] = {}  # ready() ref -> worker being placed and built
    idle: deque = deque()
    running: dict[Any, tuple[Any, int]] = {}  # run() ref -> (worker, item index)
    queue: deque = deque(range(len(items)))
    attempts = [0] * len(items)
    starts_left = target + len(items) * (args.ray_retries + 1)  # replacements are bounded too
    start_error = ""
    alone_since: Optional[float] = None  # since when no worker has been alive

    started_at: dict[Any, float] = {}  # worker -> when it was asked for
    ready_seconds: dict[Any, float] = {}  # worker -> placement, process start and imports

    def start_worker() -> None:
        nonlocal starts_left
        starts_left -= 1
        w = remote_worker.remote(make_runner, board)
        started_at[w] = time.monotonic()
        starting[w.ready.remote()] = w

    def fail_queued(reason: str) -> None:
        while queue:
            i = queue.popleft()
            results[i] = ItemFailed(reason, attempts[i])
            report.done += 1
            on_done(i, results[i], report)

    def lost(index: int, reason: str) -> None:
        attempts[index] += 1
        if attempts[index] > args.ray_retries:
            results[index] = ItemFailed(f"failed on {attempts[index]} workers; last: {reason}", attempts[index])
            report.done += 1
            on_done(index, results[index], report)
        else:
            queue.appendleft(index)
            if on_retry is not None:
                on_retry(items[index][0], reason, attempts[index])

    try:
        for _ in range(target):
            start_worker()
        while queue or running:
            while idle and queue:
                w, i = idle.popleft(), queue.popleft()
                running[w.run.remote(*items[i])] = (w, i)
            if queue and len(idle) + len(running) + len(starting) < target and starts_left > 0:
                start_worker()  # a replacement: placed when the cluster has room
            report.workers = len(idle) + len(running)
            if queue and not report.workers:
                alone_since = alone_since or time.monotonic()
                if not starting:
                    fail_queued(f"no Ray worker could start ({start_error or 'no attempts left'})")
                    continue
                if time.monotonic() - alone_since > PLACEMENT_TIMEOUT:
                    fail_queued(f"no Ray worker could be placed within {PLACEMENT_TIMEOUT:.0f} s (the cluster has "
                                f"{ray.available_resources()} free; a worker asks for --ray-gpus {args.ray_gpus:g}, "
                                f"--ray-cpus {args.ray_cpus:g})")
                    continue
            else:
                alone_since = None
            ready, _ = ray.wait(list(running) + list(starting), num_returns=1, timeout=POLL_SECONDS)
            for ref in ready:
                if ref in starting:
                    w = starting.pop(ref)
                    try:
                        ray.get(ref)
                        ready_seconds[w] = time.monotonic() - started_at[w]
                        idle.append(w)
                    except RayError as exc:  # the process could not be set up there
                        ray.kill(w)
                        start_error = _reason(exc)
                    continue
                w, i = running.pop(ref)
                try:
                    results[i] = ray.get(ref)
                except RayActorError as exc:  # the worker died: its node removed, killed for memory
                    lost(i, f"its worker died ({_reason(exc)})")
                    continue
                except (RayTaskError, RayError) as exc:  # it raised: a fresh worker for the next attempt
                    ray.kill(w)
                    lost(i, _reason(exc))
                    continue
                idle.append(w)
                report.done += 1
                on_done(i, results[i], report)
            if on_tick is not None:
                try:
                    report.board = ray.get(board.snapshot.remote(), timeout=POLL_SECONDS)
                except (GetTimeoutError, RayError):  # progress only: the work goes on without it
                    pass
                on_tick(report)
        if on_workers is not None and idle:
            try:
                stats = ray.get([w.stats.remote() for w in idle], timeout=30)
            except RayError:
                stats = []
            on_workers([{**st, "ready_seconds": ready_seconds.get(w)} for w, st in zip(idle, stats)])
    finally:
        for w in [*idle, *(w for w, _ in running.values()), *starting.values()]:
            ray.kill(w)
        ray.kill(board)
    return results


def _reason(exc: BaseException) -> str:
    """The useful line of a Ray error: the item's own exception, not Ray's wrapper and traceback."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return one_line(f"{type(cause).__name__}: {cause}", 300)
    text = str(exc).strip().splitlines()
    return one_line(text[0] if text else type(exc).__name__, 300)


# ------------------------------------------------------------------------------------ the benchmark
def run_on_ray(run, todo: list[tuple[str, Path, str]]) -> None:
    """``lingbot_map_benchmark --ray``: every sequence of ``todo`` through ``SequenceRunner.run`` on the
    cluster's workers; reported as each ends, added to the summaries in plan order (the tables and
    ``summary.json`` then equal the serial run's). Ctrl-C keeps what finished (re-raised)."""
    import functools

    from .benchmark import PROG, SequenceOutcome, SequenceRunner
    from .progress import PoolProgress

    args = run.args
    check_ray_args(args)
    ray, started_here = connect(args.ray)
    outcomes: list[Optional[SequenceOutcome]] = [None] * len(todo)
    pool_bar = PoolProgress(len(todo), f"{PROG} --ray", unit="sequences",
                            enabled=False if args.quiet else None)

    def done(index: int, result: Any, report: PoolReport) -> None:
        dataset, _, name = todo[index]
        if isinstance(result, ItemFailed):
            result = SequenceOutcome(dataset, name, reason=result.reason)
        outcomes[index] = result
        frames = result.metrics.get("frames", 0) if result.metrics and not result.kept else 0
        pool_bar.finished(f"{dataset}/{name}", frames)
        run.report(result, f"[{report.done}/{report.total}]")
        if not args.quiet and not pool_bar.enabled:  # a log: the totals after each sequence
            print(pool_bar.line(), file=sys.stderr, flush=True)

    def retry(key: str, reason: str, attempt: int) -> None:
        print(f"{PROG}: warning: {key}: {reason}; running it again on another worker (attempt {attempt + 1} of "
              f"{args.ray_retries + 1})", file=sys.stderr, flush=True)

    items = [(f"{dataset}/{name}", (dataset, root, name)) for dataset, root, name in todo]
    make_runner = functools.partial(SequenceRunner, args, _quiet_say if args.quiet else _worker_say)
    try:
        run_pool(ray, args, make_runner, items, board_name=f"benchmark:{run.out.resolve()}", on_done=done,
                 on_tick=lambda report: pool_bar.update_from(report.board, report.workers), on_retry=retry,
                 on_workers=lambda stats: write_worker_stats(run.out, stats, pool_bar, PROG, args.quiet))
    finally:
        pool_bar.close()
        for outcome in outcomes:  # plan order, whatever order they ended in
            if outcome is not None:
                run.add(outcome)
        if started_here:
            ray.shutdown()


def write_worker_stats(out: Path, stats: list[dict], bar, prog: str, quiet: bool) -> None:
    """``OUT/ray_workers.json``: per worker its start-up (placement and imports, the model) and each
    item's seconds there; one line of it on stderr. The numbers of a many-GPU run's cost."""
    import json

    from ..core.files import atomic_open

    doc = {"wall_seconds": time.monotonic() - bar._bar._start, "frames": bar.frames_done, "workers": stats}
    out.mkdir(parents=True, exist_ok=True)
    with atomic_open(out / "ray_workers.json", "w") as f:
        f.write(json.dumps(doc, indent=1))
    if not quiet:
        starts = ", ".join(f"{st['ready_seconds'] or 0:.1f} s + model {st['model_seconds'] or 0:.1f} s"
                           for st in stats)
        print(f"[{prog} --ray] {len(stats)} workers, start-up each (process, model): {starts} -> "
              f"{out / 'ray_workers.json'}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ many recordings
def run_recordings_on_ray(args: argparse.Namespace, extra: list[str], recordings: list, outcomes: list,
                          report_one: Callable[[Any, str], None]) -> None:
    """``lingbot_map_batch --ray``: every recording through ``RecordingRunner.run`` (lingbot_map_offline)
    on the cluster's workers; ``outcomes`` filled in recording order, ``report_one`` as each ends."""
    import functools

    from .batch import PROG, RecordingOutcome, RecordingRunner
    from .progress import PoolProgress

    ray, started_here = connect(args.ray)
    bar = PoolProgress(len(recordings), f"{PROG} --ray", unit="recordings", enabled=False if args.quiet else None)

    def done(index: int, result: Any, report: PoolReport) -> None:
        if isinstance(result, ItemFailed):
            result = RecordingOutcome(recordings[index].name, reason=result.reason)
        outcomes[index] = result
        bar.finished(recordings[index].name, 0 if result.kept else result.frames)
        report_one(result, f"[{report.done}/{report.total}]")
        if not args.quiet and not bar.enabled:
            print(bar.line(), file=sys.stderr, flush=True)

    def retry(key: str, reason: str, attempt: int) -> None:
        print(f"{PROG}: warning: {key}: {reason}; running it again on another worker (attempt {attempt + 1} of "
              f"{args.ray_retries + 1})", file=sys.stderr, flush=True)

    items = [(rec.name, (rec,)) for rec in recordings]
    try:
        run_pool(ray, args, functools.partial(RecordingRunner, args, extra), items,
                 board_name=f"batch:{Path(args.out).expanduser().resolve()}", on_done=done,
                 on_tick=lambda report: bar.update_from(report.board, report.workers), on_retry=retry)
    finally:
        bar.close()
        if started_here:
            ray.shutdown()


def _worker_say(message: str) -> None:
    print(f"[worker] {message}", file=sys.stderr, flush=True)


def _quiet_say(message: str) -> None:
    pass


__all__ = ["ItemFailed", "ProgressBoard", "Worker", "add_ray_options", "check_ray_args", "connect", "run_on_ray",
           "run_pool", "run_recordings_on_ray"]
