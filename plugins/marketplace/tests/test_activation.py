"""Space activation, agent selection and the pins resolved at claim, over
HTTP: the bullets of seed 001 §14 that this part of the plugin covers, each
a test named after its bullet (a *run* is an attempt; *fails the run* means
the claim is refused and no attempt exists).

The worker-side bullets (materialization, verification failure, the run
token's downloads, unset environment variables) are in test_materialize.py.
Not applicable: "Tier 1 conversations still load no plugins": BuildMax has
no conversation surface; every run is an attempt, covered above.
"""

from __future__ import annotations

import json

import pytest
from buildmax_hookspecs import Verdict, hookimpl
from buildmax_marketplace.tables import activations
from buildmax_tasks.tables import attempts

from .archives import FILES, SKILL_ONLY, tar_gz

HOOKED = "lint-helpers"  # contributes a hook and MCP servers
SKILLS = "notes"  # skills only


def versioned(files: dict[str, str], version: str) -> dict[str, str]:
    manifest = files["buildmax-plugin.toml"]
    old = "1.2.0" if '"1.2.0"' in manifest else "0.1"
    return {**files, "buildmax-plugin.toml": manifest.replace(f'"{old}"', f'"{version}"')}


@pytest.fixture
async def space(market, tmp_path):
    """A space with a project, the two plugins published (the hooked one
    eligible), and helpers to define agents, tasks and claims."""

    class Space:
        base = f"/v1/spaces/{market.space.id}"

        async def publish(self, files, name, version):
            path = tar_gz(tmp_path / f"{name}-{version}.tar.gz", versioned(files, version))
            return await market.publish(path, name)

        async def eligible(self, made):
            path = f"/v1/catalog/{made['name']}/releases/{made['version']}/eligibility"
            body = {"eligible": True, "sha256": made["sha256"]}
            return await market.call("POST", path, market.admin, json=body, expect=200)

        async def activate(self, name, version, who=None, expect=201, **kw):
            return await market.call(
                "PUT",
                f"{self.base}/plugins/{name}",
                who or market.owner,
                json={"version": version},
                expect=expect,
                **kw,
            )

        async def agent(self, name, plugins, expect=201, **kw):
            body = {"name": name, "instructions": "work", "plugins": plugins}
            return await market.call(
                "POST", f"{self.base}/agents", market.owner, json=body, expect=expect, **kw
            )

        async def revise(self, agent, plugins, expect=201):
            body = {"instructions": "work again", "plugins": plugins}
            return await market.call(
                "POST",
                f"{self.base}/agents/{agent}/revisions",
                market.owner,
                json=body,
                expect=expect,
            )

        async def claim(self, agent=None, expect=201, **kw):
            task = await market.call(
                "POST",
                f"{self.base}/tasks",
                market.owner,
                json={"project": "main", "title": "run", "agent": agent},
                expect=201,
            )
            answer = await market.call(
                "POST",
                f"{self.base}/tasks/{task['id']}/claim",
                market.agent,
                json={},
                expect=expect,
                **kw,
            )
            return task, answer

        async def mode(self, mode, who=None, expect=200):
            return await market.call(
                "PUT",
                f"{self.base}/curation",
                who or market.owner,
                json={"mode": mode},
                expect=expect,
            )

        async def view(self):
            return await market.call("GET", f"{self.base}/plugins", market.agent, expect=200)

    made = Space()
    await market.call(
        "POST", f"{made.base}/projects", market.owner, json={"name": "main"}, expect=201
    )
    made.hooked = await made.publish(FILES, HOOKED, "1.0")
    made.skills = await made.publish(SKILL_ONLY, SKILLS, "1.0")
    return made


def pins_of(answer):
    return [
        (p["name"], p["version"], p["sha256"])
        for p in answer["attempt"]["run_environment"]["plugins"]["pins"]
    ]


async def test_an_activation_pins_a_version_and_a_digest_and_a_release_published_afterwards_does_not_change_what_a_dispatched_run_loads(
    market, space
):
    await space.activate(SKILLS, "1.0")
    await space.agent("writer", [SKILLS])
    task = await market.call(
        "POST",
        f"{space.base}/tasks",
        market.owner,
        json={"project": "main", "title": "dispatched", "agent": "writer"},
        expect=201,
    )
    await space.publish(SKILL_ONLY, SKILLS, "2.0")
    claim = await market.call(
        "POST", f"{space.base}/tasks/{task['id']}/claim", market.agent, json={}, expect=201
    )
    assert pins_of(claim) == [(SKILLS, "1.0", space.skills["sha256"])]
    shown = (await space.view())["items"][0]
    assert (shown["version"], shown["newer_release"]) == ("1.0", "2.0")


async def test_a_space_member_without_owner_or_admin_cannot_activate_anything_and_cannot_change_the_curation_mode(
    market, space
):
    await space.activate(SKILLS, "1.0", who=market.agent, expect=403)
    await space.mode("curated", who=market.agent, expect=403)
    assert await market.rows(activations) == []
    assert (await space.view())["mode"] == "open"


async def test_an_open_mode_spaces_agent_naming_an_unactivated_plugin_creates_the_activation_pinned_to_the_latest_eligible_unyanked_release_attributed_to_the_person_who_saved_that_revision(
    market, space
):
    await space.publish(SKILL_ONLY, SKILLS, "1.5")
    await space.publish(SKILL_ONLY, SKILLS, "2.0")
    await market.call(
        "POST",
        f"/v1/catalog/{SKILLS}/releases/2.0/yank",
        market.admin,
        json={"reason": "broken"},
        expect=200,
    )
    await space.agent("writer", [SKILLS])
    (item,) = (await space.view())["items"]
    assert (item["name"], item["version"], item["origin"]) == (SKILLS, "1.5", "automatic")
    assert item["activated_by"] == market.owner.id and item["agents"] == ["writer"]
    (event,) = await market.audited("activation.created")
    assert '"origin":"automatic"' in event["details"] and event["actor_id"] == market.owner.id


async def test_a_curated_mode_spaces_agent_naming_an_unactivated_plugin_is_refused_at_the_write_instead(
    market, space
):
    await space.mode("curated")
    refused = await space.agent("writer", [SKILLS], expect=422)
    assert repr(SKILLS) in refused["detail"] and "curated" in refused["detail"]
    assert await market.rows(activations) == []
    await space.activate(SKILLS, "1.0")
    await space.agent("writer", [SKILLS])


@pytest.mark.parametrize("mode", ["open", "curated"])
async def test_an_automatic_pin_does_not_advance_when_a_newer_release_is_published_in_either_mode(
    market, space, mode
):
    await space.agent("writer", [SKILLS])
    await space.mode(mode)
    await space.publish(SKILL_ONLY, SKILLS, "3.0")
    await space.revise("writer", [SKILLS])
    (item,) = (await space.view())["items"]
    assert (item["version"], item["origin"], item["newer_release"]) == ("1.0", "automatic", "3.0")


async def test_open_mode_does_not_permit_naming_a_release_contributing_hooks_or_mcp_servers_that_no_administrator_has_marked_eligible(
    market, space
):
    refused = await space.agent("linter", [HOOKED], expect=422)
    assert "eligible for unattended use" in refused["detail"] and HOOKED in refused["detail"]
    assert await market.rows(activations) == []
    await space.eligible(space.hooked)
    await space.agent("linter", [HOOKED])


async def test_a_release_contributing_a_hook_or_an_mcp_server_cannot_be_activated_until_an_administrator_marks_it_eligible_and_moving_a_pin_onto_such_a_release_is_refused_on_the_same_terms_as_a_first_activation(
    market, space
):
    refused = await space.activate(HOOKED, "1.0", expect=422, problem="activation-refused")
    assert "eligible" in refused["detail"]
    await space.eligible(space.hooked)
    await space.activate(HOOKED, "1.0")
    await space.publish(FILES, HOOKED, "1.1")
    moved = await space.activate(HOOKED, "1.1", expect=422, problem="activation-refused")
    assert "1.1" in moved["detail"]
    assert (await space.view())["items"][0]["version"] == "1.0"


async def test_eligibility_does_not_carry_from_one_release_to_the_next(market, space):
    await space.eligible(space.hooked)
    newer = await space.publish(FILES, HOOKED, "1.1")
    assert newer["eligible"] is False
    await space.activate(HOOKED, "1.1", expect=422, problem="activation-refused")


async def test_suspending_an_activation_fails_the_runs_of_the_agents_that_name_that_plugin_naming_the_plugin_in_the_error_rather_than_running_them_without_it(
    market, space
):
    await space.agent("writer", [SKILLS])
    await market.call("POST", f"{space.base}/plugins/{SKILLS}/suspend", market.agent, expect=403)
    suspended = await market.call(
        "POST", f"{space.base}/plugins/{SKILLS}/suspend", market.owner, expect=200
    )
    assert suspended["enabled"] is False
    task, refused = await space.claim("writer", expect=422, problem="run-environment-unresolved")
    assert repr(SKILLS) in refused["detail"] and "suspended" in refused["detail"]
    assert await market.rows(attempts) == []
    await market.call("POST", f"{space.base}/plugins/{SKILLS}/resume", market.owner, expect=200)
    claim = await market.call(
        "POST", f"{space.base}/tasks/{task['id']}/claim", market.agent, json={}, expect=201
    )
    assert pins_of(claim) == [(SKILLS, "1.0", space.skills["sha256"])]
    assert len(await market.audited("activation.suspended")) == 1
    assert len(await market.audited("activation.resumed")) == 1


async def test_yanking_or_archiving_leaves_an_activation_working_and_reports_its_state(
    market, space
):
    await space.activate(SKILLS, "1.0")
    await space.agent("writer", [SKILLS])
    await market.call(
        "POST",
        f"/v1/catalog/{SKILLS}/releases/1.0/yank",
        market.admin,
        json={"reason": "a bug"},
        expect=200,
    )
    await market.call(
        "POST", f"/v1/catalog/{SKILLS}/archive", market.admin, json={"reason": "gone"}, expect=200
    )
    (item,) = (await space.view())["items"]
    assert (item["yanked"], item["yank_reason"], item["archived"], item["archive_reason"]) == (
        True,
        "a bug",
        True,
        "gone",
    )
    _, claim = await space.claim("writer")
    assert pins_of(claim) == [(SKILLS, "1.0", space.skills["sha256"])]


async def test_the_audit_trail_records_activation_deactivation_pin_changes_and_eligibility_naming_actor_space_plugin_version_and_digest_prefix_and_no_configuration_value(
    market, space
):
    await space.eligible(space.hooked)
    await space.activate(HOOKED, "1.0")
    newer = await space.publish(FILES, HOOKED, "1.1")
    await space.eligible(newer)
    await space.activate(HOOKED, "1.1", expect=200)
    await market.call("POST", f"{space.base}/plugins/{HOOKED}/suspend", market.owner, expect=200)
    for action, version in (
        ("activation.created", "1.0"),
        ("activation.pin_moved", "1.1"),
        ("activation.suspended", "1.1"),
    ):
        (event,) = await market.audited(action)
        details = json.loads(event["details"])
        assert (event["actor_id"], event["space_id"], event["target_id"]) == (
            market.owner.id,
            market.space.id,
            HOOKED,
        )
        assert (details["plugin"], details["version"]) == (HOOKED, version)
        sha = space.hooked["sha256"] if version == "1.0" else newer["sha256"]
        assert details["sha256_prefix"] == sha[:12]
        assert "command" not in event["details"] and "npx" not in event["details"]
    assert (
        json.loads((await market.audited("activation.pin_moved"))[0]["details"])["from_version"]
        == "1.0"
    )
    assert len(await market.audited("catalog.release.eligible")) == 2


async def test_an_agent_that_names_no_plugin_loads_no_plugin_whatever_its_space_activated(
    market, space
):
    await space.activate(SKILLS, "1.0")
    await space.agent("plain", [])
    _, claim = await space.claim("plain")
    assert pins_of(claim) == []
    assert claim["attempt"]["run_environment"]["plugins"]["agent_revision_id"]


async def test_an_agent_that_names_a_subset_loads_that_subset_and_nothing_else(market, space):
    await space.eligible(space.hooked)
    await space.activate(SKILLS, "1.0")
    await space.activate(HOOKED, "1.0")
    await space.agent("writer", [SKILLS])
    _, claim = await space.claim("writer")
    assert pins_of(claim) == [(SKILLS, "1.0", space.skills["sha256"])]


async def test_activating_a_release_changes_no_already_defined_agents_behavior_until_an_agent_names_it(
    market, space
):
    await space.agent("plain", [])
    await space.activate(SKILLS, "1.0")
    _, claim = await space.claim("plain")
    assert pins_of(claim) == []
    (item,) = (await space.view())["items"]
    assert item["unused"] is True and item["agents"] == []


async def test_an_agent_naming_a_plugin_its_space_has_not_activated_fails_the_run_and_the_error_names_the_plugin(
    market, space
):
    await space.agent("writer", [SKILLS])
    async with market.app.db.write() as tx:
        await tx.execute(activations.delete())
    _, refused = await space.claim("writer", expect=422, problem="run-environment-unresolved")
    assert repr(SKILLS) in refused["detail"] and "not activated" in refused["detail"]
    assert await market.rows(attempts) == []


async def test_a_run_with_no_agent_loads_no_plugin(market, space):
    await space.activate(SKILLS, "1.0")
    _, claim = await space.claim(None)
    assert claim["attempt"]["run_environment"]["plugins"] == {
        "agent_revision_id": None,
        "pins": [],
    }


async def test_an_agent_whose_space_is_not_the_runs_space_is_treated_as_no_agent(market, space):
    """Defence in depth, at the hook: the tasks plugin already refuses to
    assign another space's agent."""
    from buildmax_hookspecs import AgentRevisionRef, AttemptRef
    from buildmax_marketplace.runs import run_environment

    await space.activate(SKILLS, "1.0")
    elsewhere = AgentRevisionRef(
        id="ar_x",
        agent_id="ag_x",
        space_id="sp_other",
        agent_name="x",
        number=1,
        instructions="",
        plugins=(SKILLS,),
    )
    attempt = AttemptRef(
        id="at_x",
        task_id="ta_x",
        space_id=market.space.id,
        generation=1,
        claimant_id="p",
        claimant_kind="agent",
        state="active",
        lease_expires_at=0,
    )
    async with market.app.db.read() as conn:
        assert await run_environment(market.app, conn, attempt, elsewhere) == {
            "plugins": {"agent_revision_id": None, "pins": []}
        }


async def test_an_agent_edited_after_its_run_resolved_its_pins_does_not_change_what_that_run_loads_and_an_agent_edited_between_dispatch_and_that_resolution_does(
    market, space
):
    await space.activate(SKILLS, "1.0")
    await space.agent("writer", [SKILLS])
    _, claimed = await space.claim("writer")
    await space.revise("writer", [])
    attempt = await market.call(
        "GET", f"{space.base}/attempts/{claimed['attempt']['id']}", market.agent, expect=200
    )
    assert pins_of({"attempt": attempt}) == [(SKILLS, "1.0", space.skills["sha256"])]

    task = await market.call(
        "POST",
        f"{space.base}/tasks",
        market.owner,
        json={"project": "main", "title": "later", "agent": "writer"},
        expect=201,
    )
    await space.revise("writer", [SKILLS])
    later = await market.call(
        "POST", f"{space.base}/tasks/{task['id']}/claim", market.agent, json={}, expect=201
    )
    assert pins_of(later) == [(SKILLS, "1.0", space.skills["sha256"])]


async def test_a_runs_trace_names_the_activation_and_who_made_it_and_names_the_agent_revision_whose_selection_produced_the_set_or_records_that_there_was_no_agent(
    market, space
):
    await space.activate(SKILLS, "1.0")
    made = await space.agent("writer", [SKILLS])
    _, claim = await space.claim("writer")
    recorded = claim["attempt"]["run_environment"]["plugins"]
    assert recorded["agent_revision_id"] == made["revision"]["id"]
    (pin,) = recorded["pins"]
    assert (pin["origin"], pin["activated_by"]) == ("curated", market.owner.id)
    _, bare = await space.claim(None)
    assert bare["attempt"]["run_environment"]["plugins"]["agent_revision_id"] is None


async def test_a_third_party_activation_policy_is_asked_too(market, space):
    class NoNotes:
        @hookimpl
        def buildmax_activation_policy(self, tx, space_id, release, actor):
            if release.name == SKILLS:
                return Verdict("deny", "notes are not allowed in this deployment")
            return None

    market.app.plugins.pm.register(NoNotes(), name="no-notes")
    try:
        refused = await space.activate(SKILLS, "1.0", expect=422, problem="activation-refused")
        assert refused["detail"] == "notes are not allowed in this deployment"
        refused = await space.agent("writer", [SKILLS], expect=422)
        assert "notes are not allowed" in refused["detail"]
    finally:
        market.app.plugins.pm.unregister(name="no-notes")


async def test_the_space_view_shows_per_agent_what_it_names_and_what_it_does_not(market, space):
    await space.eligible(space.hooked)
    await space.activate(SKILLS, "1.0")
    await space.activate(HOOKED, "1.0")
    await space.agent("writer", [SKILLS])
    await space.agent("plain", [])
    view = await space.view()
    assert {i["name"]: (i["agents"], i["unused"]) for i in view["items"]} == {
        SKILLS: (["writer"], False),
        HOOKED: ([], True),
    }
    assert {a["name"]: (a["names"], a["activated_not_named"]) for a in view["agents"]} == {
        "plain": ([], [HOOKED, SKILLS]),
        "writer": ([SKILLS], [HOOKED]),
    }


async def test_pins_move_only_when_somebody_moves_them_and_the_move_is_audited(market, space):
    """Item 3: a new release changes nothing for an activation or a
    dispatched task; an explicit move does, for the next claim only."""
    await space.activate(SKILLS, "1.0")
    await space.agent("writer", [SKILLS])
    _, before = await space.claim("writer")
    newer = await space.publish(SKILL_ONLY, SKILLS, "2.0")
    _, still = await space.claim("writer")
    assert pins_of(still) == pins_of(before) == [(SKILLS, "1.0", space.skills["sha256"])]
    await space.activate(SKILLS, "2.0", expect=200)
    _, after = await space.claim("writer")
    assert pins_of(after) == [(SKILLS, "2.0", newer["sha256"])]
    (moved,) = await market.audited("activation.pin_moved")
    assert json.loads(moved["details"])["from_version"] == "1.0"


async def test_concurrent_first_activations_and_mode_changes_never_answer_500(market, space):
    """Six agents naming one new plugin at once (open mode), two explicit
    first activations at once, two mode changes at once: one activation
    row, every answer a success."""
    import asyncio

    answers = await asyncio.gather(
        *(space.agent(f"writer-{n}", [SKILLS], expect=None) for n in range(6))
    )
    assert all("id" in a for a in answers), answers
    assert len(await market.rows(activations)) == 1
    assert len(await market.audited("activation.created")) == 1

    await space.eligible(space.hooked)
    firsts = await asyncio.gather(*(space.activate(HOOKED, "1.0", expect=None) for _ in range(2)))
    assert sorted(a.get("version") for a in firsts) == ["1.0", "1.0"], firsts
    modes = await asyncio.gather(*(space.mode("curated", expect=None) for _ in range(2)))
    assert [m["mode"] for m in modes] == ["curated", "curated"], modes
    assert len(await market.audited("curation.changed")) == 1


async def test_the_trace_names_who_last_moved_the_pin(market, space):
    await space.activate(SKILLS, "1.0")
    await space.publish(SKILL_ONLY, SKILLS, "1.1")
    admin = await market.call(
        "PUT",
        f"{space.base}/plugins/{SKILLS}",
        market.admin,
        json={"version": "1.1"},
        expect=200,
    )
    assert admin["updated_by"] == market.admin.id
    (moved,) = await market.audited("activation.pin_moved")
    assert moved["admin_override"] == 1
    await space.agent("writer", [SKILLS])
    _, claim = await space.claim("writer")
    (pin,) = claim["attempt"]["run_environment"]["plugins"]["pins"]
    assert (pin["activated_by"], pin["updated_by"]) == (market.owner.id, market.admin.id)


async def test_withdrawn_eligibility_stops_the_runs_that_would_load_the_release(market, space):
    await space.eligible(space.hooked)
    await space.agent("linter", [HOOKED])
    path = f"/v1/catalog/{HOOKED}/releases/1.0/eligibility"
    body = {"eligible": False, "sha256": space.hooked["sha256"]}
    await market.call("POST", path, market.admin, json=body, expect=200)
    view = (await space.view())["items"][0]
    assert (view["executable"], view["eligible"]) == (True, False)
    _, refused = await space.claim("linter", expect=422, problem="run-environment-unresolved")
    assert repr(HOOKED) in refused["detail"] and "eligible" in refused["detail"]
    assert await market.rows(attempts) == []


async def test_open_mode_pins_a_final_release_and_newer_ignores_pre_releases(market, space):
    await space.publish(SKILL_ONLY, SKILLS, "2.0rc1")
    await space.agent("writer", [SKILLS])
    (item,) = (await space.view())["items"]
    assert (item["version"], item["newer_release"]) == ("1.0", None)
    await space.activate(SKILLS, "2.0rc1", expect=200)  # on purpose: allowed
    assert (await space.view())["items"][0]["version"] == "2.0rc1"


async def test_an_archived_plugin_is_not_activated(market, space):
    await market.call(
        "POST", f"/v1/catalog/{SKILLS}/archive", market.admin, json={"reason": "old"}, expect=200
    )
    refused = await space.activate(SKILLS, "1.0", expect=422, problem="activation-refused")
    assert "archived" in refused["detail"]
    refused = await space.agent("writer", [SKILLS], expect=422)
    assert "archived" in refused["detail"]
