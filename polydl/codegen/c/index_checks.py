"""Run-time checks of the subscripts a kernel reads from index arrays (`ir.Indirect`).

Takes a `PolyModel` and the arrays' layouts; returns `IndexChecks`: one `IndexCheck` per index
array, indexed array, dimension and constant, where each runs, and the C text around them. An
index array that is an input the nest reads in full is checked once, before the loops, in a loop
the compiler vectorises (an OR of two comparisons per value): a bad value returns before
anything is written. Any other (one the nest writes, or reads only in part) is checked where it
is read: the first bad value is recorded, that access uses the dimension's first cell instead,
and the kernel returns when its loops are done. Either way the kernel returns 1 + the check's
number, and `<function>_index_fault(&position, &value)` gives the index array's flat position and
the value it held (per calling thread).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from polydl.codegen.artifact import IndexCheck
from polydl.codegen.c_expr import ArrayLayout, CheckedAt, IndexSite
from polydl.ir import Access, Indirect, expr_loads
from polydl.names import spelling
from polydl.poly.model import PolyModel


@dataclass(frozen=True)
class IndexChecks:
    checks: tuple[IndexCheck, ...] = ()
    sites: dict[IndexSite, CheckedAt] = field(default_factory=dict)
    before_loops: tuple[str, ...] = ()  # C lines, at the top of the kernel function

    @property
    def at_access(self) -> bool:
        """Whether some check runs where its value is read (the kernel keeps a fault record)."""
        return any(c.at_access for c in self.sites.values())


def _sites(model: PolyModel) -> dict[IndexSite, list[tuple[Access, isl.Map]]]:
    """Each site, with the index array's reads that select it and their access relations."""
    out: dict[IndexSite, list[tuple[Access, isl.Map]]] = {}
    for s in model.statements:
        for acc in [s.statement.target, *expr_loads(s.statement.value)]:
            for d, index in enumerate(acc.indices):
                if not isinstance(index, Indirect):
                    continue
                relation = next(a.relation for a in s.accesses
                                if not a.is_write and a.access == index.access)
                site = (index.access.array, acc.array, d, index.offset)
                out.setdefault(site, []).append((index.access, relation))
    return out


def plan_index_checks(model: PolyModel, layouts: dict[str, ArrayLayout],
                      given: dict[str, str]) -> IndexChecks:
    """The checks of `model`'s subscripts read from index arrays. `given`: inputs the
    function receives under another name (copied onto a cache line after the checks)."""
    sites = _sites(model)
    if not sites:
        return IndexChecks()
    inputs = {a.name for a in model.nest.inputs}
    checks: list[IndexCheck] = []
    placed: dict[IndexSite, CheckedAt] = {}
    lines: list[str] = []
    for number, (site, reads) in enumerate(sorted(sites.items())):
        index_array, array, dim, offset = site
        extent = layouts[array].shape[dim]
        read = isl.UnionSet.empty(model.extents[index_array].get_space())
        for _, relation in reads:
            read = read.union(isl.UnionSet.from_set(relation.range()))
        whole = isl.UnionSet.from_set(model.extents[index_array]).is_subset(read)
        before = index_array in inputs and whole
        low, high = -offset, extent - 1 - offset
        checks.append(IndexCheck(index_array, layouts[index_array].shape, array, dim, extent,
                                 offset, before))
        placed[site] = CheckedAt(number, low, high, at_access=not before)
        if before:
            lines += _check_lines(number, given.get(index_array, index_array),
                                  layouts[index_array], low, high, array, dim)
    return IndexChecks(tuple(checks), placed, tuple(lines))


def _check_lines(number: int, pointer: str, layout: ArrayLayout, low: int, high: int,
                 array: str, dim: int) -> list[str]:
    count = 1
    for extent in layout.shape:
        count *= extent
    value = f"(long){pointer}[_pd_p]"
    outside = f"({value} < {low}L) | ({value} > {high}L)"
    return [
        f"/* {spelling(layout.name)} selects in {spelling(array)}'s dimension {dim}: every value "
        "checked first */",
        "{",
        "  long _pd_bad = 0;",
        f"  for (long _pd_p = 0; _pd_p < {count}L; _pd_p++) _pd_bad |= {outside};",
        "  if (_pd_bad)",
        f"    for (long _pd_p = 0; _pd_p < {count}L; _pd_p++)",
        f"      if ({outside}) return pd_index_fault({number}, _pd_p, {value});",
        "}",
    ]


def helpers(function: str) -> str:
    """The C the checks call, and the exported `<function>_index_fault`."""
    return f"""\
/* the last failed index check of this thread's call: the index array's flat position and value */
static _Thread_local long pd_index_fault_at[2];

static int pd_index_fault(int check, long position, long value)
{{
  pd_index_fault_at[0] = position;
  pd_index_fault_at[1] = value;
  return check + 1;
}}

void {function}_index_fault(long *position, long *value)
{{
  *position = pd_index_fault_at[0];
  *value = pd_index_fault_at[1];
}}

/* `value`, or `low` where it is outside [low, high]: then the first such value of the call is
 * recorded in fault[] (check + 1, position, value) and the kernel returns its check's status */
static inline long pd_checked(long value, long low, long high, int check, long position,
                              long *fault)
{{
  if (__builtin_expect(value < low || value > high, 0)) {{
    long none = 0;
    if (__atomic_compare_exchange_n(&fault[0], &none, (long)check + 1, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED)) {{
      fault[1] = position;
      fault[2] = value;
    }}
    return low;
  }}
  return value;
}}
"""


def check_text(number: int, check: IndexCheck) -> str:
    """What status `number + 1` means, for the header."""
    plus = f" + {check.offset}" if check.offset > 0 else f" - {-check.offset}" if check.offset else ""
    return (f"{number + 1}: a value of {spelling(check.index_array)}{plus} outside "
            f"0..{check.extent - 1} (dimension {check.dimension} of {spelling(check.array)})")
