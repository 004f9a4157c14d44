"""Differential testing of polydl's general C path: random affine loop nests compiled by polydl
and by gcc -O0, compared element by element (tests/differential/).

    python tools/differential.py --count 1000 --seed 1 [--jobs 1] [--keep DIR] [--gathers]

Each program is generated from its seed (seed S, S+1, ...), built once by gcc (sizes are its
parameters) and by polydl at each of its size sets (sizes are compile-time), on a machine
drawn among this host's ISA, AVX2 and portable C. Programs run in worker processes, so a kernel
that crashes or hangs is recorded as such (`--timeout` seconds a program) and the worker is
replaced. Every program that is not ok (a mismatch, a polydl failure or traceback, a refusal
of a valid program, a crash, a timeout) is written to DIR/<seed>-<status>/: the C, its sizes
and machine, the inputs' seed, `polydl explain`, polydl's generated source, and where cheap a
minimised program that still fails the same way.

The kernels run with OMP_NUM_THREADS=4 (unless set) so parallel loops run on several threads
even on a small host, and OMP_WAIT_POLICY=passive so waiting threads do not spin. The compile
cache is a fresh temporary folder unless POLYDL_CACHE_DIR is set.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import signal
import sys
import tempfile
import time
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.differential.generator import Options, generate  # noqa: E402

NOT_OK = ("mismatch", "failed", "error")


def _worker(conn: Connection, options: Options, minimize_budget: int) -> None:
    """Answer seeds with outcomes until told to stop (None)."""
    from tests.differential.minimize import minimize, same_failure
    from tests.differential.runner import check

    while True:
        seed = conn.recv()
        if seed is None:
            return
        try:
            program = generate(seed, options)
        except Exception as err:  # noqa: BLE001 - the generator's own bug, reported as such
            conn.send(("result", {"seed": seed, "status": "generator", "runs": [], "reports": [],
                                  "error": f"{type(err).__name__}: {err}"}))
            conn.send(("minimized", None))
            continue
        keep: list[dict[str, Any]] = []
        before = _cpu_seconds()
        outcome = check(program, seed=seed, keep=keep)
        runs = [r.to_dict() for r in outcome.runs]
        reports = [{"run": k["run"].to_dict(), "source": k["source"], "explain": k["explain"]} for k in keep]
        conn.send(("result", {"seed": seed, "status": outcome.status, "runs": runs, "reports": reports,
                              "cpu": _cpu_seconds() - before}))
        bad = [(i, r) for i, r in enumerate(outcome.runs)
               if r.status in NOT_OK or (r.status == "refused" and not r.expected)]
        if bad and minimize_budget > 0:
            index, run = bad[0]
            small = minimize(program, index, run.machine, same_failure(run.status, run.reason),
                             budget=minimize_budget)
            conn.send(("minimized", {"c": small.c(), "sizes": dict(small.size_sets[0]),
                                     "machine": run.machine}))
        else:
            conn.send(("minimized", None))


def _cpu_seconds() -> float:
    """CPU time of this process and of the compilers it ran."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


class Worker:
    def __init__(self, ctx: Any, options: Options, budget: int) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker, args=(child, options, budget), daemon=True)
        self.process.start()
        child.close()
        self.seed: int | None = None
        self.deadline = 0.0
        self.result: dict[str, Any] | None = None
        self.started = 0.0

    def give(self, seed: int, timeout: float) -> None:
        self.seed, self.result = seed, None
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.conn.send(seed)

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _write_case(keep: Path, seed: int, status: str, options: Options, data: dict[str, Any] | None,
                minimized: dict[str, Any] | None) -> None:
    folder = keep / f"{seed}-{status}"
    folder.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {"seed": seed, "status": status, "gathers": options.gathers}
    try:
        program = generate(seed, options)
        (folder / "program.c").write_text(program.c())
        info["size_sets"] = program.sizes()
    except Exception as err:  # noqa: BLE001
        info["generator_error"] = f"{type(err).__name__}: {err}"

    if data is not None:
        info["runs"] = data["runs"]
        for k, report in enumerate(data["reports"]):
            (folder / f"explain{k}.txt").write_text(report["explain"] or "")
            if report["source"]:
                (folder / f"generated{k}.c").write_text(report["source"])
            (folder / f"detail{k}.txt").write_text(report["run"]["detail"])
    if minimized is not None:
        (folder / "minimized.c").write_text(minimized["c"])
        info["minimized"] = {"sizes": minimized["sizes"], "machine": minimized["machine"]}
    (folder / "case.json").write_text(json.dumps(info, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--keep", type=Path, default=None, help="folder for failing programs")
    ap.add_argument("--gathers", action="store_true", help="generate x[idx[i]] subscripts")
    ap.add_argument("--size-sets", type=int, default=2, help="size sets each program is compiled at")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for one program")
    ap.add_argument("--minimize", type=int, default=80, help="checks spent shrinking a failure (0: none)")
    ap.add_argument("--restart", type=int, default=200, help="programs a worker runs before it is replaced")
    args = ap.parse_args(argv)

    # stop with the summary on Ctrl-C or a kill: a shell's background job inherits SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    os.environ.setdefault("OMP_NUM_THREADS", "4")
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    cache = None
    if "POLYDL_CACHE_DIR" not in os.environ:
        cache = tempfile.TemporaryDirectory(prefix="polydl-differential-")
        os.environ["POLYDL_CACHE_DIR"] = cache.name
    options = Options(gathers=args.gathers, size_sets=args.size_sets)
    ctx = mp.get_context("forkserver")
    seeds = list(range(args.seed, args.seed + args.count))
    workers = [Worker(ctx, options, args.minimize) for _ in range(max(1, args.jobs))]
    done_by: Counter[int] = Counter()
    programs: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    refusals: Counter[tuple[bool, str]] = Counter()
    failures: list[tuple[int, str, str]] = []
    start = time.monotonic()
    last_print = 0.0
    finished = 0
    cpu = 0.0

    def record(w: Worker, status: str, data: dict[str, Any] | None, minimized: dict[str, Any] | None) -> None:
        nonlocal finished, cpu
        assert w.seed is not None
        cpu += (data or {}).get("cpu", 0.0)
        finished += 1
        programs[status] += 1
        reasons = []
        if data is not None:
            for r in data["runs"]:
                runs[r["status"]] += 1
                if r["status"] == "refused":
                    refusals[(r["expected"], r["reason"])] += 1
                    if not r["expected"]:
                        reasons.append("refused: " + r["reason"])
                elif r["status"] != "ok":
                    reasons.append(f"{r['status']}: {r['reason']}")
        if data is None or status == "generator":
            reasons.append(status)
        if reasons and args.keep is not None:
            _write_case(args.keep, w.seed, status if status != "refused" else "refused", options, data, minimized)
        if reasons:
            failures.append((w.seed, status, "; ".join(sorted(set(reasons)))))
            print(f"  seed {w.seed}: {failures[-1][2]}", flush=True)
        w.seed = None

    pending = list(seeds)
    try:
        while pending or any(w.seed is not None for w in workers):
            for k, w in enumerate(workers):
                if w.seed is None and pending:
                    if done_by[k] >= args.restart:
                        w.stop()
                        workers[k] = w = Worker(ctx, options, args.minimize)
                        done_by[k] = 0
                    w.give(pending.pop(0), args.timeout)
                    done_by[k] += 1
            for k, w in enumerate(workers):
                if w.seed is None:
                    continue
                try:
                    if w.conn.poll(0.05):
                        kind, payload = w.conn.recv()
                        if kind == "result":
                            w.result = payload
                            failing = payload["status"] in NOT_OK or any(
                                r["status"] == "refused" and not r["expected"] for r in payload["runs"])
                            if failing:
                                w.deadline = time.monotonic() + args.timeout * 4  # minimising
                        else:
                            assert w.result is not None
                            record(w, w.result["status"], w.result, payload)
                    elif time.monotonic() > w.deadline:
                        w.process.kill()
                        w.process.join()
                        if w.result is not None:  # it timed out while minimising
                            record(w, w.result["status"], w.result, None)
                        else:
                            record(w, "timeout", None, None)
                        workers[k] = Worker(ctx, options, args.minimize)
                        done_by[k] = 0
                except (EOFError, ConnectionResetError, BrokenPipeError):
                    w.process.join()
                    if w.result is not None:
                        record(w, w.result["status"], w.result, None)
                    else:
                        record(w, "crash", None, None)
                    workers[k] = Worker(ctx, options, args.minimize)
                    done_by[k] = 0
            now = time.monotonic()
            if now - last_print > 30:
                last_print = now
                rate = finished / max(now - start, 1e-9)
                print(f"[{finished}/{len(seeds)}] {dict(programs)} {rate:.2f} programs/s", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    finally:
        for w in workers:
            w.stop()
    wall = time.monotonic() - start
    print()
    print(f"programs run: {finished} (seeds {args.seed}..{args.seed + args.count - 1}), "
          f"size sets compiled: {sum(runs.values())}")
    print(f"programs by worst outcome: {dict(programs)}")
    print(f"size sets: {dict(runs)}; accepted (compiled by polydl and compared): "
          f"{sum(n for k, n in runs.items() if k != 'refused')}")
    print(f"refusals the contract documents: {sum(n for (e, _), n in refusals.items() if e)}")
    for (expected, reason), n in refusals.most_common():
        if expected:
            print(f"  {n:5d}  {reason}")
    print(f"refusals of valid programs: {sum(n for (e, _), n in refusals.items() if not e)}")
    for (expected, reason), n in refusals.most_common():
        if not expected:
            print(f"  {n:5d}  {reason}")
    print(f"mismatches: {runs['mismatch']}, polydl failures: {runs['failed']}, tracebacks: {runs['error']}, "
          f"crashes: {programs['crash']}, timeouts: {programs['timeout']}")
    print(f"wall {wall:.0f} s, {finished / wall:.2f} programs/s with {len(workers)} job(s) "
          f"({finished / wall / len(workers):.2f} per job); CPU {cpu:.0f} s in the checks and their "
          f"compilers: {finished / max(cpu, 1e-9):.2f} programs per CPU-second")
    if cache is not None:
        cache.cleanup()
    bad = runs["mismatch"] + runs["failed"] + runs["error"] + programs["crash"] + programs["timeout"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
