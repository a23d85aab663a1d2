"""The typed rows: each SELECT reads exactly its dataclass's fields, and
one naming rule holds (``pk`` the numeric key, ``id`` the public id)."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa
from buildmax_tasks import records
from buildmax_tasks.rows import (
    AgentRevisionRow,
    AgentRow,
    AttemptRow,
    DecisionRow,
    HoldRow,
    ProjectRow,
    SubmissionRow,
    TaskRow,
)
from buildmax_tasks.tables import attempts, holds, projects, tasks

from buildmax.tables import row_field

pytestmark = pytest.mark.engine_independent

READS = [
    (records.TASK_SELECT, TaskRow),
    (records.ATTEMPT_SELECT, AttemptRow),
    (records.SUBMISSION_SELECT, SubmissionRow),
    (records.AGENT_REVISION_SELECT, AgentRevisionRow),
    (records.AGENT_SELECT, AgentRow),
    (records.PROJECT_SELECT, ProjectRow),
    (records.HOLD_SELECT, HoldRow),
    (records.DECISION_SELECT, DecisionRow),
]


@pytest.mark.parametrize(("select", "row"), READS, ids=lambda v: getattr(v, "__name__", ""))
def test_a_select_reads_its_rows_fields(select: sa.Select, row: type) -> None:
    labels = [column.key for column in select.selected_columns]
    assert len(labels) == len(set(labels)), "a label read twice"
    stored = {
        f.name
        for f in dataclasses.fields(row)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert set(labels) == stored


@pytest.mark.parametrize(("select", "row"), READS, ids=lambda v: getattr(v, "__name__", ""))
def test_keys_end_in_pk_and_public_ids_in_id(select: sa.Select, row: type) -> None:
    """Every numeric key a row holds is named ``pk`` or ``*_pk``; every
    ``id`` or ``*_id`` field is text (a public id)."""
    for column in select.selected_columns:
        name = column.key
        integer = isinstance(column.type, sa.Integer)
        if name == "id" or name.endswith("_id"):
            assert not integer, f"{row.__name__}.{name} holds a numeric key"
        if name == "pk" or name.endswith("_pk"):
            assert integer, f"{row.__name__}.{name} is not a numeric key"


def test_the_rule_names_table_columns() -> None:
    assert row_field(tasks.c.id) == "pk"
    assert row_field(tasks.c.public_id) == "id"
    assert row_field(tasks.c.current_attempt_id) == "current_attempt_pk"
    assert row_field(tasks.c.created_by) == "created_by_pk"
    assert row_field(attempts.c.token_id) == "token_id"  # a token's public id, as text
    assert row_field(projects.c.name) == "name"
    assert row_field(holds.c.scope_pk) == "scope_pk"
    assert row_field(holds.c.lifted_by) == "lifted_by_pk"  # a principal, by foreign key
