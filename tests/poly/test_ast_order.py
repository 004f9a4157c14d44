"""`poly.ast_order`: the order an isl AST runs its instances in, read back from the AST, so that
a plan can check the code isl prints and not only the tree it was given."""

from __future__ import annotations

import islpy as isl

from polydl.poly.ast_order import ast_schedule, tree_ast

# isl's AST of this tree runs S9[i + 1] before S11[i] at c0 = 4 and 8, though the second band
# puts S11 (2) before S9 (3): found by the differential tests (seed 31295, minimised).
_DOMAIN = ("{ S11[i, j] : 0 <= i <= 2 and 0 <= j <= 1; S9[i, j] : 0 <= i <= 2 and 0 <= j <= 1; "
           "S10[i, j, k = 1] : 0 <= i <= 2 and 0 <= j <= 1; S4[i] : 0 <= i <= 2 }")
BROKEN = '{ domain: "' + _DOMAIN + '",' + """
  child: { schedule: "[{ S11[i, j] -> [(4 + 4i)]; S9[i, j] -> [(4i)]; S10[i, j, k] -> [(6i)]; S4[i] -> [(0)] }]",
  child: { schedule: "[{ S11[i, j] -> [(2)]; S9[i, j] -> [(3)]; S10[i, j, k] -> [(4 - i)]; S4[i] -> [(1 + 5i)] }]",
  child: { sequence: [
    { filter: "{ S11[i, j]; S10[i, j, k] }", child: { schedule: "[{ S11[i, j] -> [(j)]; S10[i, j, k] -> [(j)] }]",
      child: { sequence: [ { filter: "{ S10[i, j, k] }" }, { filter: "{ S11[i, j] }" } ] } } },
    { filter: "{ S4[i] }" },
    { filter: "{ S9[i, j] }", child: { schedule: "[{ S9[i, j] -> [(j)] }]" } } ] } } } }"""

# Strides, guards, an else branch and a loop of step 3: isl prints them faithfully.
KEPT = """{ domain: "{ A[i, j] : 0 <= i < 10 and 0 <= j <= i; B[i] : 0 <= i < 10 }",
  child: { schedule: "[{ A[i, j] -> [(3i)]; B[i] -> [(3i + 1)] }]",
  child: { sequence: [ { filter: "{ B[i] }" },
    { filter: "{ A[i, j] }", child: { schedule: "[{ A[i, j] -> [(i - j)] }]" } } ] } } }"""


def _tree_order(tree: isl.Schedule) -> isl.UnionMap:
    smap = tree.get_map().intersect_domain(tree.get_domain())
    return smap.lex_lt_union_map(smap)


def _broken_pairs(text: str) -> isl.UnionMap:
    tree = isl.Schedule(text)
    order = ast_schedule(tree_ast(tree))
    assert order is not None
    assert order.domain().is_equal(tree.get_domain())  # every instance, once read back
    return _tree_order(tree).subtract(order.lex_lt_union_map(order))


def test_the_order_of_faithful_code_is_the_tree_order() -> None:
    assert _broken_pairs(KEPT).is_empty()


def test_a_broken_order_is_seen() -> None:
    broken = _broken_pairs(BROKEN)
    assert broken.is_subset(isl.UnionMap("{ S11[i, j] -> S9[i + 1, j']; S11[2, 0] -> S10[2, 1, 1] }"))
    assert not broken.intersect(isl.UnionMap("{ S11[0, 0] -> S9[1, 0] }")).is_empty()


def test_the_time_follows_blocks_and_loops() -> None:
    tree = isl.Schedule("""{ domain: "{ A[i] : 0 <= i < 4; B[i] : 0 <= i < 4 }",
      child: { sequence: [ { filter: "{ B[i] }", child: { schedule: "[{ B[i] -> [(i)] }]" } },
                           { filter: "{ A[i] }", child: { schedule: "[{ A[i] -> [(i)] }]" } } ] } }""")
    order = ast_schedule(tree_ast(tree))
    assert order is not None
    before = order.lex_lt_union_map(order)
    assert isl.UnionMap("{ B[i] -> A[i'] : 0 <= i, i' < 4 }").is_subset(before)
    assert before.intersect(isl.UnionMap("{ A[i] -> B[i'] }")).is_empty()
