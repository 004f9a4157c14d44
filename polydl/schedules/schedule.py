"""`Schedule`: how the main loop band of a nest runs — a value that serialises to JSON.

A schedule names loops of the band by their variable; a tiled variable `i` has a tile loop
`i.t` (stepping by the tile size) and a point loop `i` (inside one tile). `order` lists the loops
outermost first; `parallel` the loops run by OpenMP threads (with `private_sums`, loops that
carry the main statement's sum into its output too: each thread adds into a zeroed copy of
the output of its own, and the copies are added into the output when the loop ends); `microkernel` the innermost loops
replaced by a batch-reduce GEMM call; `epilogues` the statements fused into the band.
`scheduler="affine"` leaves the main nest to the general scheduler instead (the other fields
are then empty; the note `GENERAL_SCHEDULER_NOTE` of a compiled kernel's schedule says what that
scheduler did, and `describe()` prints it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

TILE_SUFFIX = ".t"
BAND = "band"  # the main nest follows `order`, `tiles`, `parallel`, `microkernel`
AFFINE = "affine"  # the main nest is left to the general scheduler (schedules/cpu/affine.py)
SCHEDULERS = (BAND, AFFINE)
# The note a compiled kernel's "affine" schedule carries: its main nest's bands as the general
# scheduler described them (`schedules.cpu.nests.describe_plan`), for `describe()`.
GENERAL_SCHEDULER_NOTE = "general_scheduler"


def tile_loop(var: str) -> str:
    return var + TILE_SUFFIX


def loop_var(loop: str) -> str:
    """The variable a loop name iterates: `i` for both `i` and `i.t`."""
    return loop[: -len(TILE_SUFFIX)] if loop.endswith(TILE_SUFFIX) else loop


def is_tile_loop(loop: str) -> bool:
    return loop.endswith(TILE_SUFFIX)


@dataclass(frozen=True)
class MicrokernelBinding:
    """Innermost loops of `statement` computed by one batch-reduce GEMM call.

    `m`, `n`, `k` are point loops of the GEMM `C[m][n] += A[m][k] * B[k][n]`; `batch` are the
    reduction loops outside `k` that form the batch (outermost first); `blocks`, where set, a
    loop along which C and B move and A does not (a convolution's output-channel blocks): the
    call runs its point loop too, as n blocks at their own strides (`BrgemmSpec.n_blocks`)."""

    statement: str
    m: str
    n: str
    k: str
    batch: tuple[str, ...] = ()
    backend: str = "auto"  # "auto" | "polydl" | "libxsmm"
    # Copy B into a local array blocked by the n tile (`Bp[n/nb][batch...][k][nb]`) just
    # before the first call of each n tile, so that every call reads it contiguously.
    pack_b: bool = False
    # Copy each m tile x k tile block of A into panels of register-tile rows
    # (`Ap[m/mr][k][mr]`) before the calls that read it: every call streams A contiguously.
    pack_a: bool = False
    blocks: str | None = None

    @property
    def loops(self) -> tuple[str, ...]:
        return self.batch + ((self.blocks,) if self.blocks else ()) + (self.m, self.n, self.k)


@dataclass(frozen=True)
class Schedule:
    order: tuple[str, ...] = ()
    tiles: tuple[tuple[str, int], ...] = ()
    parallel: tuple[str, ...] = ()
    microkernel: MicrokernelBinding | None = None
    epilogues: tuple[str, ...] = ()
    scheduler: str = BAND
    private_sums: bool = False
    # Numbers the ranking attached (working sets, score) and what the general scheduler did;
    # informative, not part of identity.
    notes: tuple[tuple[str, Any], ...] = field(default=(), compare=False)

    @property
    def tile_sizes(self) -> dict[str, int]:
        return dict(self.tiles)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tiles"] = dict(self.tiles)
        data["notes"] = dict(self.notes)
        if data["microkernel"] is not None and data["microkernel"]["blocks"] is None:
            del data["microkernel"]["blocks"]  # the form of schedules stored before it existed
        if not data["private_sums"]:
            del data["private_sums"]  # likewise
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Schedule:
        mk = data.get("microkernel")
        return cls(
            order=tuple(data.get("order", ())),
            tiles=tuple(sorted((str(k), int(v)) for k, v in dict(data.get("tiles", {})).items())),
            parallel=tuple(data.get("parallel", ())),
            microkernel=MicrokernelBinding(
                statement=mk["statement"],
                m=mk["m"],
                n=mk["n"],
                k=mk["k"],
                batch=tuple(mk.get("batch", ())),
                backend=mk.get("backend", "auto"),
                pack_b=bool(mk.get("pack_b", False)),
                pack_a=bool(mk.get("pack_a", False)),
                blocks=mk.get("blocks"),
            )
            if mk
            else None,
            epilogues=tuple(data.get("epilogues", ())),
            scheduler=_scheduler(data.get("scheduler", BAND)),
            private_sums=bool(data.get("private_sums", False)),
            notes=tuple(sorted(dict(data.get("notes", {})).items())),
        )

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        return cls.from_dict(json.loads(text))

    def describe(self) -> str:
        if self.scheduler == AFFINE:
            bands = dict(self.notes).get(GENERAL_SCHEDULER_NOTE)
            return "main nest by the general (affine) scheduler" + (f": {bands}" if bands else "")
        parts = ["order " + " > ".join(self.order) if self.order else "original order"]
        if self.tiles:
            parts.append("tiles " + ", ".join(f"{v}={t}" for v, t in self.tiles))
        parts.append("parallel " + (", ".join(self.parallel) if self.parallel else "none")
                     + (" (a private sum per thread)" if self.private_sums else ""))
        if self.microkernel:
            mk = self.microkernel
            batch = f" batch({', '.join(mk.batch)})" if mk.batch else ""
            batch += f" blocks({mk.blocks})" if mk.blocks else ""
            packed = ", A packed" * mk.pack_a + (", B packed" if mk.pack_b else "")
            parts.append(
                f"microkernel brgemm(m={mk.m}, n={mk.n}, k={mk.k}){batch}{packed} [{mk.backend}]"
            )
        if self.epilogues:
            parts.append("fused " + ", ".join(self.epilogues))
        return "; ".join(parts)


def _scheduler(name: object) -> str:
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, not {name!r}")
    return str(name)
