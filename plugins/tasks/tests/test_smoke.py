"""The basic loop: create, claim, renew, submit."""

from __future__ import annotations


async def test_claim_renew_submit_completes_a_task(work):
    task = await work.task()
    assert task["state"] == "ready"
    claim = await work.claim(task["id"])
    attempt = claim["attempt"]
    assert attempt["generation"] == 1 and claim["token"].startswith("bmx_")
    renewed = await work.call(
        "POST",
        f"/attempts/{attempt['id']}/renew",
        claim["token"],
        json={"generation": 1},
        expect=200,
    )
    assert renewed["state"] == "active"
    done = await work.call(
        "POST",
        f"/attempts/{attempt['id']}/submit",
        claim["token"],
        json={"generation": 1, "summary": "did it"},
        expect=201,
    )
    assert done["task"]["state"] == "done"
