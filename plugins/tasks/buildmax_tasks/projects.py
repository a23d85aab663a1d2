"""Projects: created with a unique name, edited under a revision check,
and given workflow policies as immutable revisions."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from buildmax.conflicts import insert_ignoring_conflict
from buildmax.ids import new_id
from buildmax.problems import NameTaken
from buildmax.tables import keyed

from .change import Change
from .engine import current_policy, forget_policies
from .problems import RevisionConflict
from .records import find_project
from .rows import ProjectRow
from .tables import policies, projects


async def create_project(ch: Change, creator_pk: int, fields: dict[str, Any]) -> ProjectRow:
    """A new project of the space with ``fields`` (its name, description,
    repository URL, target branch); 409 ``name-taken`` for a name the space
    has. Its row."""
    row = await ch.tx.fetch_one(
        insert_ignoring_conflict(ch.tx.dialect, projects)
        .values(
            public_id=new_id("pj"),
            space_id=ch.space_pk,
            created_at=ch.now,
            updated_at=ch.now,
            created_by=creator_pk,
            **fields,
        )
        .returning(*keyed(projects))
    )
    if row is None:
        raise NameTaken(f"a project named {fields['name']!r} already exists in this space")
    project = ProjectRow.of(row)
    await ch.audit("project.created", "project", project.id, name=fields["name"])
    await ch.event("project.created", project_id=project.id, name=fields["name"])
    return project


async def edit_project(
    ch: Change, project_ref: str, expected_revision: int, changes: dict[str, Any]
) -> ProjectRow:
    """Write ``changes`` as the project's next revision; 409 when it is not
    at ``expected_revision``. Its row."""
    row = await find_project(ch.tx, ch.space_pk, project_ref)
    written = await ch.tx.fetch_one(
        sa.update(projects)
        .where(projects.c.id == row.pk, projects.c.revision == expected_revision)
        .values(revision=projects.c.revision + 1, updated_at=ch.now, **changes)
        .returning(*keyed(projects))
    )
    if written is None:
        raise RevisionConflict(
            f"the project is at revision {row.revision}, not {expected_revision}",
            revision=row.revision,
        )
    updated = ProjectRow.of(written)
    await ch.audit(
        "project.updated",
        "project",
        row.id,
        fields=sorted(changes),
        revision=updated.revision,
    )
    await ch.event("project.updated", project_id=row.id)
    return updated


async def revise_policy(
    ch: Change,
    author_pk: int,
    project_ref: str,
    expected_revision: int | None,
    policy: dict[str, Any],
) -> int:
    """The project's next workflow policy, ``policy``; 409 when the current
    one is not at ``expected_revision`` (``None``: whatever it is). Its
    revision number."""
    row = await find_project(ch.tx, ch.space_pk, project_ref)
    locked = await ch.tx.fetch_one(
        sa.select(projects.c.id).where(projects.c.id == row.pk).with_for_update()
    )
    assert locked is not None
    current = await current_policy(ch.tx, row.pk)
    if expected_revision is not None and expected_revision != current["revision"]:
        raise RevisionConflict(
            f"the policy is at revision {current['revision']}, not {expected_revision}",
            revision=current["revision"],
        )
    revision = int(current["revision"]) + 1
    pk = await ch.tx.fetch_val(
        policies.insert()
        .values(
            project_id=row.pk,
            revision=revision,
            approvals_required=policy["approvals_required"],
            human_review_required=int(policy["human_review_required"]),
            integration=policy["integration"],
            created_at=ch.now,
            created_by=author_pk,
        )
        .returning(policies.c.id)
    )
    await ch.tx.execute(sa.update(projects).where(projects.c.id == row.pk).values(policy_id=pk))
    forget_policies(ch.tx)
    await ch.audit("policy.revised", "project", row.id, revision=revision, **policy)
    await ch.event("policy.revised", project_id=row.id, revision=revision)
    return revision
