"""A seeded world for contract tests that walk the OpenAPI document.

An admin makes, through the public API only, one of everything a path
parameter can name: a space with an agent member, a project with a review
policy, a task handed in and reviewed (a submission, a review work item, a
finding), a task with an active attempt (and an artifact of it), a held task
with an open decision, an agent definition, a spare token and a catalog
release. :meth:`World.path_parameters` maps each OpenAPI path parameter name
to the id it resolves, so a walker can fill in every route.

Both the in-process tests (Quart's test client) and the schemathesis run (a
real server over HTTP) use it through :class:`Http`, a small async interface.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from typing import Any, Protocol

#: A release the catalog accepts: a skill-only plugin.
PLUGIN_NAME = "contract-notes"
PLUGIN_VERSION = "0.1.0"
_PLUGIN_FILES = {
    "buildmax-plugin.toml": (
        f'name = "{PLUGIN_NAME}"\nversion = "{PLUGIN_VERSION}"\n[contributes]\nskills = ["note"]\n'
    ),
    "skills/note/SKILL.md": "Take notes.\n",
}


class Http(Protocol):
    """One request as ``token``; the status and the decoded JSON body."""

    async def __call__(
        self,
        method: str,
        path: str,
        *,
        token: str,
        json: Any = None,
        params: dict[str, str] | None = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]: ...


@dataclass(frozen=True)
class World:
    """The ids of what :func:`seed` made, and the tokens that act on them."""

    admin_token: str
    agent_token: str
    attempt_token: str
    space: str
    agent_principal: str
    human_principal: str
    project: str
    task: str
    prerequisite: str
    attempt: str
    generation: int
    artifact: str
    agent: str
    decision: str
    hold: str
    review_item: str
    finding: str
    submission: str
    spare_token: str
    lesson: str
    imported: str

    def path_parameters(self) -> dict[str, str]:
        """Every path parameter name of the OpenAPI document, mapped to an id
        that resolves (``name`` is the catalog plugin: the catalog, a space's
        activations and an attempt's packages all name plugins)."""
        return {
            "space": self.space,
            "project": self.project,
            "task": self.task,
            "prerequisite": self.prerequisite,
            "attempt": self.attempt,
            "artifact": self.artifact,
            "agent": self.agent,
            "decision": self.decision,
            "hold": self.hold,
            "ident": self.review_item,
            "finding": self.finding,
            "submission": self.submission,
            "lesson": self.lesson,
            "import_id": self.imported,
            "number": "1",
            "principal": self.agent_principal,
            "ref": self.human_principal,
            "token_id": self.spare_token,
            "name": PLUGIN_NAME,
            "version": PLUGIN_VERSION,
        }


def plugin_archive() -> bytes:
    """The ``.tar.gz`` of the catalog release the world publishes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in _PLUGIN_FILES.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def _ok(http: Http, method: str, path: str, *, token: str, **kwargs: Any) -> Any:
    status, body = await http(method, path, token=token, **kwargs)
    if not 200 <= status < 300:
        raise RuntimeError(f"seeding: {method} {path} answered {status}: {body}")
    return body


async def seed(http: Http, admin_token: str, slug: str = "contract") -> World:
    """Make the world as the admin holding ``admin_token``."""

    async def admin(method: str, path: str, **kwargs: Any) -> Any:
        return await _ok(http, method, path, token=admin_token, **kwargs)

    agent = await admin("POST", "/v1/principals", json={"kind": "agent", "name": f"{slug}-agent"})
    agent_token = (
        await admin("POST", "/v1/tokens", json={"name": "contract", "principal_id": agent["id"]})
    )["token"]
    human = await admin("POST", "/v1/principals", json={"kind": "human", "name": f"{slug}-human"})
    spare = await admin("POST", "/v1/tokens", json={"name": "spare"})
    space = (await admin("POST", "/v1/spaces", json={"slug": slug}))["id"]
    base = f"/v1/spaces/{space}"
    await admin("PUT", f"{base}/members/{agent['id']}", json={"role": "member"})
    await admin("PUT", f"{base}/members/{human['id']}", json={"role": "viewer"})

    project = (await admin("POST", f"{base}/projects", json={"name": "main"}))["id"]
    await admin("POST", f"{base}/projects/main/policy", json={"approvals_required": 1})

    async def task(title: str) -> str:
        made = await admin("POST", f"{base}/tasks", json={"project": "main", "title": title})
        return str(made["id"])

    reviewed, active, held = (
        await task("handed in and reviewed"),
        await task("in progress"),
        await task("held, with a question"),
    )

    # The agent hands in one task; the admin reviews it, asking for a change.
    claim = await _ok(http, "POST", f"{base}/tasks/{reviewed}/claim", token=agent_token, json={})
    handed = await _ok(
        http,
        "POST",
        f"{base}/attempts/{claim['attempt']['id']}/submit",
        token=claim["token"],
        json={"generation": claim["attempt"]["generation"], "summary": "done"},
    )
    (review_item,) = handed["work_ids"]
    review_claim = await admin("POST", f"{base}/tasks/{review_item}/claim", json={})
    review = await admin(
        "POST",
        f"{base}/reviews/{review_item}",
        json={
            "decision": "request_changes",
            "findings": [{"severity": "minor", "text": "rename", "path": "a.py", "line": 1}],
            "generation": review_claim["attempt"]["generation"],
        },
    )

    # The agent holds an attempt on another task, with an artifact of it.
    running = await _ok(
        http,
        "POST",
        f"{base}/tasks/{active}/claim",
        token=agent_token,
        json={"lease_seconds": 3600},
    )
    artifact = await _ok(
        http,
        "POST",
        f"{base}/artifacts",
        token=running["token"],
        params={"name": "notes.txt"},
        content=b"contract notes\n",
        headers={"Content-Type": "text/plain"},
    )

    hold = await admin(
        "POST",
        f"{base}/holds",
        json={"scope": "task", "target": held, "strength": "suspended", "reason": "waiting"},
    )
    decision = await admin(
        "POST", f"{base}/tasks/{held}/decisions", json={"question": "go?", "options": ["yes", "no"]}
    )
    definition = await admin("POST", f"{base}/agents", json={"name": "contract-bot"})
    lesson = await admin(
        "POST",
        f"{base}/lessons",
        json={"kind": "gotcha", "title": "contract lesson", "text": "what the world learned"},
    )
    imported = await admin(
        "POST",
        f"{base}/imports",
        params={"format": "csv", "project": project},
        content=b"id,title\nc-1,an imported task\n",
        headers={"Content-Type": "application/octet-stream"},
    )
    await admin(
        "POST",
        f"{base}/imports/{imported['id']}/chunks/1",
        json={"identity": imported["identity"]},
    )
    await admin(
        "POST",
        f"/v1/catalog/{PLUGIN_NAME}/releases",
        content=plugin_archive(),
        headers={"Content-Type": "application/octet-stream"},
    )
    return World(
        admin_token=admin_token,
        agent_token=agent_token,
        attempt_token=running["token"],
        space=space,
        agent_principal=agent["id"],
        human_principal=human["id"],
        project=project,
        task=active,
        prerequisite=held,
        attempt=running["attempt"]["id"],
        generation=running["attempt"]["generation"],
        artifact=artifact["id"],
        agent=definition["id"],
        decision=decision["id"],
        hold=hold["id"],
        review_item=review_item,
        finding=review["findings"][0]["id"],
        submission=handed["submission"]["id"],
        spare_token=spare["id"],
        lesson=lesson["id"],
        imported=imported["id"],
    )
