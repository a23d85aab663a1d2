"""A bound the server's settings decide is the one the document shows and
the server holds to: ``lease_seconds`` up to ``[plugins.tasks]
lease_max_seconds`` and ``limit`` up to ``page_size_max``, here set below
their defaults."""

from __future__ import annotations

import dataclasses

import pytest

LEASE_MAX = 120
PAGE_MAX = 7


@pytest.fixture
def buildmax_settings(buildmax_settings):
    return dataclasses.replace(
        buildmax_settings,
        page_size_max=PAGE_MAX,
        page_size_default=5,
        plugins={"tasks": {"lease_seconds": 60, "lease_max_seconds": LEASE_MAX}},
    )


async def test_settings_decide_the_documented_and_enforced_bound(client, admin, make_space):
    """Catches a bound written as a constant in the schema (the document
    would say 3600 or 200 while the server refuses less), or checked only in
    the handler (the document would show no maximum)."""
    document = await (await client.get("/v1/openapi.json")).get_json()
    schemas = document["components"]["schemas"]
    for body in ("ClaimBody", "ClaimNextBody", "RenewBody"):
        lease = schemas[body]["properties"]["lease_seconds"]
        assert (lease["minimum"], lease["maximum"]) == (1, LEASE_MAX), body
    (limit,) = [
        p for p in document["paths"]["/v1/spaces"]["get"]["parameters"] if p["name"] == "limit"
    ]
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, PAGE_MAX)

    space = await make_space(admin)
    claims = f"/v1/spaces/{space.id}/claims"
    for lease, status in ((LEASE_MAX, 200), (LEASE_MAX + 1, 422)):
        answer = await client.post(claims, json={"lease_seconds": lease}, headers=admin.headers)
        assert answer.status_code == status, await answer.get_json()
    refused = await (
        await client.post(claims, json={"lease_seconds": LEASE_MAX + 1}, headers=admin.headers)
    ).get_json()
    assert refused["errors"] == {"lease_seconds": [f"Must be between 1 and {LEASE_MAX}."]}
    for limit_value, status in ((PAGE_MAX, 200), (PAGE_MAX + 1, 422)):
        answer = await client.get(f"/v1/spaces?limit={limit_value}", headers=admin.headers)
        assert answer.status_code == status
