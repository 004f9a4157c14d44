"""One program through both compilers: polydl's kernel at each size set against gcc -O0.

`check(program)` builds the gcc reference once (sizes are its parameters), then for each size
set compiles the program with polydl (sizes are compile-time), calls the kernel twice on the
same inputs (the second call catches state a call leaves behind) and compares every output
(`oracle.compare`) and every input (unchanged, bit for bit).

A run ends in one of: "ok"; "refused" (a polydl `SpecError`; `reason` says which rule, and
`expected` whether the program broke a documented rule: a size below 1, sizes at which no
statement runs); "mismatch" (a wrong output or a changed input); "failed" (another polydl
error: a schedule or compile error on a valid program); "error" (an exception that is no
polydl error: a raw traceback).
"""

from __future__ import annotations

import os
import re
import tempfile
import traceback
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import polydl
from polydl.errors import PolyDLError, SpecError
from tests.differential.oracle import Reference, compare, make_inputs
from tests.differential.program import Access, Affine, Assign, Declare, Program, expr_accesses, walk_domains

# Machines the kernels are built for, by weight: this host's ISA, AVX2, portable C, and
# AVX-512 with caches of a few KiB (`small_caches`), whose tiles are smaller than the sizes
# generated, so tiled and skewed schedules are exercised at sizes gcc -O0 runs in milliseconds.
MACHINES = (("native", 2), ("x86-64-v3", 1), ("generic", 1), ("small-caches", 3))
# Refusals the contract documents: a size below 1, sizes at which no statement runs.
EXPECTED_REFUSALS = (re.compile(r"size parameter '\w+' must be >= 1"), re.compile(r"no statement of '\w+' runs"))


@dataclass(frozen=True)
class Run:
    """One size set of one program."""

    sizes: dict[str, int]
    machine: str
    status: str  # ok, refused, mismatch, failed, error
    reason: str = ""
    expected: bool = False  # a refusal the contract documents
    detail: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"sizes": self.sizes, "machine": self.machine, "status": self.status,
                "reason": self.reason, "expected": self.expected, "detail": self.detail}


@dataclass
class Outcome:
    program: Program
    runs: list[Run] = field(default_factory=list)

    @property
    def status(self) -> str:
        order = ("error", "failed", "mismatch", "refused", "ok")
        statuses = {r.status for r in self.runs} or {"ok"}
        return next(s for s in order if s in statuses)


def machine_value(name: str) -> object:
    """The `machine=` argument a machine's name stands for, with forks and barriers priced at
    one cycle: at the sizes generated no loop would be worth its forks, and the schedules that
    only pay with parallel loops would never run (a price, not a legality rule)."""
    from polydl.target import resolve_target, target_from_dict

    description = resolve_target("c", "x86-64-v4" if name == "small-caches" else name).to_dict()
    if name == "small-caches":
        description.update(name="small-caches", cores=4, l1_bytes=1024, l2_bytes=4096,
                           l3_bytes=16384)
    description.update(fork_join_cycles=1.0, barrier_cycles=1.0)
    return target_from_dict(description)


@contextmanager
def parallel_wherever_legal() -> Iterator[None]:
    """The general scheduler runs every loop in parallel that may be (every start priced as
    paying) and takes isl's order wherever it computes one: at the sizes generated no loop would
    be worth its forks, the written order would be kept almost always, and isl's tiled, skewed
    and parallel schedules would never run. Prices and a margin, not legality rules."""
    from polydl.schedules.cpu import forks, nests
    from polydl.settings import cache_dir

    # the compile cache's key does not hold the choices: these lowerings get a cache of their own
    saved = nests._beats, forks.ParallelLoop.pays, os.environ.get("POLYDL_CACHE_DIR")
    nests._beats = lambda transformed, written: True  # type: ignore[assignment]
    forks.ParallelLoop.pays = lambda self, start: True  # type: ignore[method-assign]
    os.environ["POLYDL_CACHE_DIR"] = str(Path(cache_dir()) / "parallel-wherever-legal")
    try:
        yield
    finally:
        nests._beats, forks.ParallelLoop.pays = saved[0], saved[1]  # type: ignore[method-assign]
        if saved[2] is None:
            del os.environ["POLYDL_CACHE_DIR"]
        else:
            os.environ["POLYDL_CACHE_DIR"] = saved[2]


def machine_for(program: Program, index: int) -> str:
    rng = np.random.default_rng(zlib.crc32(program.name.encode()) + index)
    names = [m for m, _ in MACHINES]
    weights = np.array([w for _, w in MACHINES], float)
    return str(rng.choice(names, p=weights / weights.sum()))


def reason_of(err: PolyDLError) -> str:
    """A refusal's rule, without the names and numbers of this program."""
    message = getattr(err, "message", None) or str(err).splitlines()[0]
    message = message.splitlines()[0]
    message = re.sub(r"^.*?error: ", "", message)
    message = re.sub(r"'[^']*'", "'X'", message)
    message = re.sub(r" runs at [^:]*:", " runs at SIZES:", message)
    message = re.sub(r"extent \(.*\) = ", "extent E = ", message)
    return re.sub(r"-?\d+", "#", message)[:120]


def reduction_length(program: Program, sizes: Mapping[str, int]) -> int:
    """The most instances an accumulating statement runs into one cell, summed over them, plus
    the chain length of each recurrence."""
    total = 0
    declared: dict[str, int] = {}  # local -> instances of its declaration

    def see(stmt: Assign | Declare, env: dict[str, np.ndarray]) -> None:
        nonlocal total
        n = len(next(iter(env.values())))
        if isinstance(stmt, Declare):
            declared[stmt.name] = n
        elif stmt.op == "=" and n and not isinstance(stmt.target, str) and any(
                a.array == stmt.target.array for a in expr_accesses(stmt.value)):
            # a recurrence (a stencil, a wavefront): each value from earlier ones of the same
            # array, its rounding carried along a chain of about 2 sqrt(n) instances
            total += int(2 * n ** 0.5)
        elif stmt.op != "=" and n:
            if isinstance(stmt.target, str):
                total += max(1, n // max(declared.get(stmt.target, 1), 1))
            else:
                cells = _cells(stmt.target, env, n)
                total += int(np.unique(cells, return_counts=True)[1].max()) if cells is not None else n

    walk_domains(program, sizes, see)
    return total


def _cells(target: Access, env: dict[str, np.ndarray], n: int) -> np.ndarray | None:
    key = np.zeros(n, np.int64)
    for s in target.subscripts:
        if not isinstance(s, Affine):
            return None
        key = key * 100003 + np.broadcast_to(np.asarray(s.value(env), np.int64), n)
    return key


def check(program: Program, *, seed: int = 0, only: Sequence[int] | None = None,
          machines: Mapping[int, str] | None = None, keep: list[dict[str, object]] | None = None,
          workdir: Path | None = None) -> Outcome:
    """Run `program` at its size sets (those of `only`, by index) through polydl and gcc.

    `machines` overrides the machine of a size set; `keep` receives, for each run that is not
    ok or refused, what a report needs (generated source, explain text)."""
    outcome = Outcome(program)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        reference = Reference.built(program, Path(tmp))
        for index, sizes in enumerate(program.sizes()):
            if only is not None and index not in only:
                continue
            machine = (machines or {}).get(index) or machine_for(program, index)
            run = _run(program, reference, sizes, machine, seed * 7919 + index, keep)
            outcome.runs.append(run)
    return outcome


def _run(program: Program, reference: Reference, sizes: dict[str, int], machine: str,
         seed: int, keep: list[dict[str, object]] | None) -> Run:
    text = program.c()
    try:
        with parallel_wherever_legal():
            kernel = polydl.compile(text, sizes, machine=machine_value(machine))  # type: ignore[arg-type]
    except SpecError as err:
        expected = any(e.search(str(err).split("\n")[0]) for e in EXPECTED_REFUSALS)
        return Run(sizes, machine, "refused", reason_of(err), expected, str(err)[:2000])
    except PolyDLError as err:
        return _kept(Run(sizes, machine, "failed", type(err).__name__ + ": " + reason_of(err),
                         detail=str(err)[:4000]), program, sizes, machine, None, keep)
    except Exception:  # noqa: BLE001 - a raw traceback is the finding
        return _kept(Run(sizes, machine, "error", "traceback", detail=traceback.format_exc()[-4000:]),
                     program, sizes, machine, None, keep)
    # a NaN or an infinity converted to int is undefined in C: none where the program converts
    special = bool(np.random.default_rng(seed).random() < 0.1) and "(int)" not in text
    values = make_inputs(program, sizes, seed, special)
    own = reference.run(sizes, values)
    other = reference.run(sizes, values, other=True)
    reduction = reduction_length(program, sizes)
    problems: list[str] = []
    for call in range(2):
        args = {k: v.copy() for k, v in values.items()}
        try:
            result = kernel(**args)
        except Exception:  # noqa: BLE001
            return _kept(Run(sizes, machine, "error", "kernel call", detail=traceback.format_exc()[-4000:]),
                         program, sizes, machine, kernel, keep)
        del result
        for a in program.arrays:
            if a.is_input and not np.array_equal(args[a.name], values[a.name], equal_nan=True):
                problems.append(f"call {call + 1}: input {a.name} was changed")
        differences = compare(program, args, own, other, reduction)
        if differences:  # rounding that a contracted FMA carries through a recurrence?
            fused = reference.run(sizes, values, contracted=True)
            differences = compare(program, args, own, other, reduction, fused)
        for d in differences:
            problems.append(f"call {call + 1}: {d.describe()}")
        if problems:
            break
    if not problems:
        return Run(sizes, machine, "ok")
    detail = "\n".join(problems) + f"\n(inputs seed {seed}{', with a NaN or infinity' if special else ''}; " \
        f"reduction length {reduction})"
    return _kept(Run(sizes, machine, "mismatch", problems[0].split(":")[1].strip(), detail=detail),
                 program, sizes, machine, kernel, keep)


def _kept(run: Run, program: Program, sizes: dict[str, int], machine: str, kernel: object,
          keep: list[dict[str, object]] | None) -> Run:
    if keep is not None:
        keep.append({"run": run, "source": getattr(kernel, "source", None),
                     "explain": explain_text(program, sizes, machine)})
    return run


def explain_text(program: Program, sizes: Mapping[str, int], machine: str) -> str:
    """`polydl explain` of the program at these sizes (or why it could not be made)."""
    from polydl.api import lower
    from polydl.driver.explain import explain
    from polydl.frontends import load_spec

    try:
        nest, bound = load_spec(program.c(), dict(sizes))
        with parallel_wherever_legal():
            return explain(lower(nest, bound, machine=machine_value(machine)))  # type: ignore[arg-type]
    except Exception as err:  # noqa: BLE001 - the report says why there is none
        return f"(no explain: {type(err).__name__}: {err})"
