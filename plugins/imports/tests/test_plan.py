"""The preview of an import: actions, kept and refused edges, the order
and chunks, and the identity that makes a plan stale."""

from __future__ import annotations

import pytest
from buildmax_hookspecs import SourceLink, SourceRecord
from buildmax_imports.plan import Earlier, digest, plan

pytestmark = pytest.mark.engine_independent


def rec(source_id: str, *waits_for: str, line: int = 1, **fields: object) -> SourceRecord:
    links = tuple(SourceLink("prerequisite", t) for t in waits_for) + tuple(
        fields.pop("links", ())  # type: ignore[arg-type]
    )
    fields.setdefault("title", f"t {source_id}")
    return SourceRecord(source_id=source_id, line=line, links=links, **fields)  # type: ignore[arg-type]


def plan_of(records: list[SourceRecord], earlier: dict[str, Earlier] | None = None, **kw: object):
    return plan(records, [], earlier or {}, file_digest="f", service_revision="r", **kw)  # type: ignore[arg-type]


def test_each_record_is_created_updated_left_alone_or_a_conflict() -> None:
    fresh, same, changed, edited, reopened = (
        rec("A"),
        rec("B"),
        rec("C", title="new title"),
        rec("D", title="source edit"),
        rec("E", state="ready", source_state="open"),
    )
    # What an earlier import of B (then on line 40), C, D and E applied.
    before = plan_of([rec("B", line=40), rec("C"), rec("D"), rec("E", state="done")])
    applied = {item.record.source_id: item.digest for item in before.items}
    earlier = {
        "B": Earlier("ta_b", applied["B"], "ready"),
        "C": Earlier("ta_c", applied["C"], "ready"),
        "D": Earlier("ta_d", applied["D"], "ready", changed_here=True),
        "E": Earlier("ta_e", applied["E"], "done"),
    }
    made = plan_of([fresh, same, changed, edited, reopened], earlier)
    actions = {item.record.source_id: (item.action, item.task_id) for item in made.items}
    assert actions == {
        "A": ("create", None),
        "B": ("unchanged", "ta_b"),
        "C": ("update", "ta_c"),
        "D": ("conflict", "ta_d"),
        "E": ("update", "ta_e"),
    }
    notes = {item.record.source_id: item.notes for item in made.items}
    assert "not applied" in notes["D"][0]
    assert notes["E"] == (
        "done here: it stays closed and its text is not revised (the source has it open)",
    )
    assert [made.count(a) for a in ("create", "update", "unchanged", "conflict")] == [1, 2, 1, 1]


def test_broken_links_and_a_record_waiting_for_itself_are_listed_and_left_out() -> None:
    made = plan_of(
        [
            rec(
                "A",
                "nowhere",
                "B",
                links=[SourceLink("parent", "gone"), SourceLink("related", "B")],
            ),
            rec("B", "B", "old"),
        ],
        {"old": Earlier("ta_old", "x", "done")},
    )
    assert [(e.source, e.kind, e.target) for e in made.refused] == [
        ("A", "prerequisite", "nowhere"),
        ("A", "parent", "gone"),
        ("B", "prerequisite", "B"),
    ]
    assert "broken link" in made.refused[0].reason
    kept = {item.record.source_id: (item.prerequisites, item.links) for item in made.items}
    assert kept == {"B": (("old",), ()), "A": (("B",), (SourceLink("related", "B"),))}


def test_a_cycle_loses_the_edge_that_closes_it_and_the_rest_is_imported() -> None:
    made = plan_of([rec("A", "B"), rec("B", "C"), rec("C", "A"), rec("D", "C")])
    assert [(e.source, e.target) for e in made.refused] == [("C", "A")]
    assert made.refused[0].reason == "it would close a cycle: A -> B -> C -> A"
    assert [item.record.source_id for item in made.items] == ["C", "B", "A", "D"]
    assert made.count("create") == 4


def test_prerequisites_come_first_and_chunks_cut_the_order() -> None:
    records = [rec(f"R{n}", f"R{n + 1}") for n in range(9)] + [rec("R9")]
    made = plan_of(records, chunk_size=4)
    order = [item.record.source_id for item in made.items]
    assert order == [f"R{n}" for n in range(9, -1, -1)]
    assert [item.chunk for item in made.items] == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3]
    assert made.chunks == [("R9", "R6"), ("R5", "R2"), ("R1", "R0")]
    position = {source_id: n for n, source_id in enumerate(order)}
    for item in made.items:
        assert all(position[p] < position[item.record.source_id] for p in item.prerequisites)


def test_a_long_chain_and_a_big_cycle_need_no_recursion() -> None:
    chain = [rec(f"N{n}", f"N{n + 1}") for n in range(5000)] + [rec("N5000", "N0")]
    made = plan_of(chain, chunk_size=500)
    assert len(made.refused) == 1 and len(made.items) == 5001 and len(made.chunks) == 11


def test_the_identity_changes_with_the_file_the_service_and_the_space() -> None:
    records = [rec("A")]
    base = plan(records, [], {}, file_digest="f", service_revision="r").identity
    assert plan(records, [], {}, file_digest="f", service_revision="r").identity == base
    assert plan(records, [], {}, file_digest="g", service_revision="r").identity != base
    assert plan(records, [], {}, file_digest="f", service_revision="s").identity != base
    then = {"A": Earlier("ta_a", "d", "ready")}
    now = {"A": Earlier("ta_a", "d", "done")}
    assert (
        plan(records, [], then, file_digest="f", service_revision="r").identity
        != plan(records, [], now, file_digest="f", service_revision="r").identity
    )


def test_a_record_exported_again_where_it_moved_in_the_file_is_unchanged() -> None:
    assert digest(rec("A", line=1)) == digest(rec("A", line=900))
    assert digest(rec("A")) != digest(rec("A", title="other"))


def test_a_long_cycle_is_named_by_its_ends() -> None:
    chain = [rec(f"N{n}", f"N{n + 1}") for n in range(999)] + [rec("N999", "N0")]
    (refused,) = plan_of(chain).refused
    assert refused.reason == (
        "it would close a cycle: N0 -> N1 -> N2 -> N3 -> (993 more) -> N997 -> N998 -> N999 -> N0"
    )


def test_a_link_to_itself_is_refused_and_the_chunk_size_is_part_of_the_identity() -> None:
    made = plan_of([rec("A", links=[SourceLink("parent", "A")]), rec("B")], chunk_size=1)
    assert [(e.source, e.kind, e.reason) for e in made.refused] == [
        ("A", "parent", "a link to itself")
    ]
    assert made.items[0].links == ()
    other = plan_of([rec("A", links=[SourceLink("parent", "A")]), rec("B")], chunk_size=2)
    assert made.identity != other.identity


def test_a_record_whose_broken_link_now_has_a_record_is_applied_again() -> None:
    first = plan_of([rec("A", "B", links=[SourceLink("related", "C")])])
    assert len(first.refused) == 2
    (item,) = first.items
    again = plan_of(
        [rec("A", "B", links=[SourceLink("related", "C")]), rec("B"), rec("C")],
        {"A": Earlier("ta_a", item.digest, "ready")},
    )
    (a,) = [i for i in again.items if i.record.source_id == "A"]
    assert a.action == "update" and a.prerequisites == ("B",) and len(a.links) == 1
    same = plan_of(
        [rec("A", "B", links=[SourceLink("related", "C")])],
        {"A": Earlier("ta_a", item.digest, "ready")},
    )
    assert [i.action for i in same.items] == ["unchanged"]
