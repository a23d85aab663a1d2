"""A run's packages are for current members of the run's space only (issue
14, item 6).

``GET /v1/attempts/{a}/packages`` and the package download live outside
``/v1/spaces/{space}``, so no space role was ever asked there: a removed
member kept reading its attempt's packages with its main token and with the
run token. Now the route asks for the member role in the attempt's space,
and removing a member ends its runs there (the tasks plugin answers
``buildmax_member_changed``), so the run token stops working too.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from buildmax.spaces import put_member
from buildmax.tables import space_members, tokens

from .archives import SKILL_ONLY, tar_gz

SKILLS = "notes"


@pytest.fixture
async def runs(market, make_principal, tmp_path) -> dict[str, Any]:
    """Two agent members of the space, each holding a run of a task whose
    agent names the skill-only plugin: {"leaver": (principal, claim),
    "stayer": (principal, claim)}."""
    base = f"/v1/spaces/{market.space.id}"
    await market.publish(tar_gz(tmp_path / "s.tar.gz", SKILL_ONLY), SKILLS)
    await market.call("POST", f"{base}/projects", market.owner, json={"name": "main"}, expect=201)
    body = {"name": "worker", "instructions": "", "plugins": [SKILLS]}
    await market.call("POST", f"{base}/agents", market.owner, json=body, expect=201)
    stayer = await make_principal("agent", name="stayer")
    async with market.app.db.write() as tx:
        await put_member(tx, market.space.pk, stayer.pk, "member", market.app.clock.now_ms())
    found = {"leaver": (market.agent, await market.claim_new(base, "one", "worker"))}
    task = await market.call(
        "POST",
        f"{base}/tasks",
        market.owner,
        json={"project": "main", "title": "two", "agent": "worker"},
        expect=201,
    )
    claim = await market.call(
        "POST", f"{base}/tasks/{task['id']}/claim", stayer, json={}, expect=201
    )
    found["stayer"] = (stayer, claim)
    return found


async def reads(market: Any, who: Any, attempt: str, expect: int, problem: str) -> None:
    """``who`` gets ``expect`` with ``problem`` on both package routes of ``attempt``."""
    for path in (f"/v1/attempts/{attempt}/packages", f"/v1/attempts/{attempt}/packages/{SKILLS}"):
        await market.call("GET", path, who, expect=expect, problem=problem)


async def reads_fine(market: Any, who: Any, attempt: str) -> None:
    listing = await market.call("GET", f"/v1/attempts/{attempt}/packages", who, expect=200)
    assert [p["name"] for p in listing["pins"]] == [SKILLS]
    package = await market.call("GET", f"/v1/attempts/{attempt}/packages/{SKILLS}", who, expect=200)
    assert package[:2] == b"\x1f\x8b"  # the release archive itself


async def token_row(market: Any, token_id: str) -> dict[str, Any]:
    [row] = await market.rows(tokens, tokens.c.public_id == token_id)
    return row


async def test_a_removed_member_reads_no_run_package_with_either_token(market, runs):
    """After ``DELETE /members/{p}`` the main token gets 404 and the run
    token 401 on the listing and the download; the run token's row is
    revoked; the other member's run is untouched."""
    leaver, claim = runs["leaver"]
    stayer, kept = runs["stayer"]
    mine = claim["attempt"]["id"]
    await reads_fine(market, leaver, mine)
    await reads_fine(market, claim["token"], mine)

    await market.call(
        "DELETE", f"/v1/spaces/{market.space.id}/members/{leaver.id}", market.owner, expect=204
    )

    await reads(market, leaver, mine, 404, "not-found")
    await reads(market, claim["token"], mine, 401, "unauthenticated")
    assert (await token_row(market, claim["token_id"]))["revoked_at"] is not None
    # Forbidden side effects: the member who stays keeps its run and tokens.
    await reads_fine(market, stayer, kept["attempt"]["id"])
    await reads_fine(market, kept["token"], kept["attempt"]["id"])
    assert (await token_row(market, kept["token_id"]))["revoked_at"] is None
    [event] = await market.audited("space.member.removed")
    assert event["target_id"] == leaver.id


async def test_the_package_routes_ask_for_membership_even_of_a_live_run_token(market, runs):
    """Membership gone while the run token is still live (its row deleted
    behind the server's back, so nothing revoked the token): both tokens get
    404, exactly as for an attempt that does not exist. Catches: the member
    role no longer asked by the package routes (the landed behaviour)."""
    leaver, claim = runs["leaver"]
    async with market.app.db.write() as tx:
        await tx.execute(
            sa.delete(space_members).where(
                space_members.c.space_id == market.space.pk,
                space_members.c.principal_id == leaver.pk,
            )
        )
    assert (await token_row(market, claim["token_id"]))["revoked_at"] is None
    mine = claim["attempt"]["id"]
    for who in (leaver, claim["token"]):
        await reads(market, who, mine, 404, "not-found")
        unknown = await market.call("GET", "/v1/attempts/at_nowhere/packages", who, expect=404)
        refused = await market.call("GET", f"/v1/attempts/{mine}/packages", who, expect=404)
        assert refused["detail"] == unknown["detail"]  # no hint that the attempt exists


async def test_a_claimant_demoted_to_viewer_reads_no_run_package(market, runs):
    """A viewer runs no work: the demotion ends the run (run token 401) and
    the main token is refused 403 (a member whose role is too low)."""
    leaver, claim = runs["leaver"]
    await market.call(
        "PUT",
        f"/v1/spaces/{market.space.id}/members/{leaver.id}",
        market.owner,
        json={"role": "viewer"},
        expect=200,
    )
    mine = claim["attempt"]["id"]
    await reads(market, leaver, mine, 403, "forbidden")
    await reads(market, claim["token"], mine, 401, "unauthenticated")
