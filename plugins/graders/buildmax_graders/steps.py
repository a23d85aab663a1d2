"""The steps a journey file may use in ``[[arrange]]`` and ``[[act]]``.

Every step is ``async def step(run, spec)``: ``spec`` is the step's table
(not yet rendered), the return value is saved under the step's ``save`` key.
Steps act only through public surfaces — HTTP, the ``buildmax`` CLI, process
signals, an MCP client — except ``tamper``, which writes the database
directly on purpose and is recorded as an injected fault. ``python`` calls a
function of a module in the qualification's ``steps/`` directory for what
data cannot say. A step kind listed in :data:`STEP_CHECKS` has its table
checked when the journey file loads.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import os
import random
import select
import socket
import struct
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from .journey import render
from .mcp_call import check as check_mcp
from .mcp_call import tool_call
from .process import BUILDMAX, Finished, run_command
from .run import HarnessError, JourneyRun, StepFailed

StepFunction = Callable[[JourneyRun, Mapping[str, Any]], Awaitable[Any]]

#: Bytes of an answer body kept as text in the saved value.
TEXT_KEPT = 64 * 1024

_MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


def _problem_line(body: Any) -> str:
    if isinstance(body, Mapping):
        return str(body.get("detail") or body.get("title") or "")[:200]
    return str(body)[:200] if body else ""


def answer_record(
    answer: httpx.Response, run: JourneyRun, download_to: str | None
) -> dict[str, Any]:
    """What a request step saves: status, headers, the decoded body (JSON,
    else text), and for ``download_to`` the file's name and digest."""
    kind = answer.headers.get("content-type", "")
    data = answer.content
    body: Any
    if "json" in kind:
        try:
            body = answer.json()
        except ValueError:
            body = answer.text[:TEXT_KEPT]
    elif kind.startswith("text/") or not data:
        body = answer.text[:TEXT_KEPT]
    else:
        body = None
    if isinstance(body, Mapping) and isinstance(body.get("token"), str):
        run.secret(body["token"])  # a token minted through the API: redacted, looked for in logs
    record: dict[str, Any] = {
        "status": answer.status_code,
        "headers": {k.lower(): v for k, v in answer.headers.items()},
        "body": body,
        "bytes": len(data),
    }
    if download_to:
        path = run.workdir / download_to
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        record["file"] = download_to
        record["sha256"] = hashlib.sha256(data).hexdigest()
    return record


def _expected(spec: Mapping[str, Any]) -> tuple[int, ...] | None:
    expect = spec.get("expect")
    if expect is None:
        return None
    return tuple(expect) if isinstance(expect, list) else (int(expect),)


def _check_expected(label: str, record: Mapping[str, Any], expect: tuple[int, ...] | None) -> None:
    if expect is not None and record["status"] not in expect:
        wanted = " or ".join(map(str, expect))
        said = _problem_line(record["body"])
        raise StepFailed(f"{label}: status {record['status']}, expected {wanted}: {said}")


def _request_parts(
    run: JourneyRun, spec: Mapping[str, Any], extra: Mapping[str, Any] | None = None
) -> tuple[str, str, dict[str, Any]]:
    values = {**run.values, **(extra or {})}
    method = str(spec.get("method", "GET")).upper()
    path = str(render(values, spec["path"]))
    headers: dict[str, str] = {}
    token = run.token(render(values, spec.get("as")))
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if method in _MUTATING:
        key = render(values, spec.get("idempotency_key")) or str(uuid.uuid4())
        headers["Idempotency-Key"] = str(key)
    headers.update({k: str(v) for k, v in render(values, spec.get("headers", {})).items()})
    kwargs: dict[str, Any] = {"headers": headers}
    if "json" in spec:
        kwargs["json"] = render(values, spec["json"])
    if "params" in spec:
        kwargs["params"] = render(values, spec["params"])
    if "content" in spec:
        kwargs["content"] = str(render(values, spec["content"])).encode()
    if "content_file" in spec:
        kwargs["content"] = (run.workdir / str(render(values, spec["content_file"]))).read_bytes()
    url = run.url(int(spec.get("server", 0))) + path
    return method, url, kwargs


async def request(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """One HTTP request ``as`` an actor (``admin``, a saved principal, or
    ``anonymous``): ``method``, ``path``, ``json``/``content``/``content_file``,
    ``params``, ``headers``, ``idempotency_key``, ``server`` (process index).
    ``expect`` (a status or list) makes another status fail the step;
    ``download_to`` keeps the body as a file; ``kill_after`` SIGKILLs the
    server the moment the answer has arrived."""
    method, url, kwargs = _request_parts(run, spec)
    answer = await run.http.request(method, url, **kwargs)
    record = answer_record(answer, run, spec.get("download_to"))
    if spec.get("kill_after"):
        index = int(spec.get("server", 0))
        run.deployment.kill(index)
        run.inject(
            "server-killed",
            f"SIGKILL to server {index} right after the answer to {method} "
            f"{url.split('//', 1)[1].split('/', 1)[1]} arrived (status {record['status']})",
        )
    _check_expected(f"{method} {spec['path']}", record, _expected(spec))
    return record


async def race(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """``count`` copies of a request sent together (released by one barrier
    once every connection is open); ``{i}`` in its strings is the copy's
    index. Saves every answer and the count of each status."""
    count = int(spec["count"])
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    prepared = [_request_parts(run, spec, {"i": i}) for i in range(count)]
    go = asyncio.Event()
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as http:
        # Open every connection first, so the race is between requests, not handshakes.
        await asyncio.gather(
            *(http.get(run.url(int(spec.get("server", 0))) + "/livez") for _ in range(count))
        )

        async def one(index: int) -> dict[str, Any]:
            method, url, kwargs = prepared[index]
            await go.wait()
            return answer_record(await http.request(method, url, **kwargs), run, None)

        tasks = [asyncio.create_task(one(i)) for i in range(count)]
        await asyncio.sleep(0)
        go.set()
        answers = await asyncio.gather(*tasks)
    statuses = Counter(str(a["status"]) for a in answers)
    return {"answers": answers, "statuses": dict(statuses), "count": count}


async def principal(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """Create principals as the admin, each with an API token: ``name``
    (``{i}`` numbered when ``count`` is given), ``kind`` (default ``agent``),
    ``system_role``, ``password`` (humans), ``spaces`` (``{slug: role}``
    memberships). Each is saved under its own name: ``{id, name, token}``."""
    count = spec.get("count")
    made = []
    for i in range(int(count) if count is not None else 1):
        values = {**run.values, "i": i}
        name = str(render(values, spec["name"]))
        body = {
            "kind": spec.get("kind", "agent"),
            "name": name,
            "display_name": "",
            "system_role": spec.get("system_role"),
        }
        if spec.get("password"):
            body["password"] = run.secret(str(render(values, spec["password"])))
        made_principal = await _admin_call(run, "POST", "/v1/principals", body)
        token = await _admin_call(
            run,
            "POST",
            "/v1/tokens",
            {"name": "qualification", "principal_id": made_principal["id"]},
        )
        record = {"id": made_principal["id"], "name": name, "token": run.secret(token["token"])}
        for slug, role in render(values, spec.get("spaces", {})).items():
            await _admin_call(run, "PUT", f"/v1/spaces/{slug}/members/{name}", {"role": role})
        run.save(name, record)
        made.append(record)
    return made if count is not None else made[0]


async def space(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """Create a space as the admin (``slug``, ``name``) with ``members``
    (``{principal name: role}``); saves the space (``id``, ``slug``)."""
    slug = str(run.render(spec["slug"]))
    made = await _admin_call(
        run, "POST", "/v1/spaces", {"slug": slug, "name": spec.get("name", slug)}
    )
    for name, role in run.render(spec.get("members", {})).items():
        await _admin_call(run, "PUT", f"/v1/spaces/{slug}/members/{name}", {"role": role})
    return made


async def _admin_call(run: JourneyRun, method: str, path: str, body: Any) -> Any:
    headers = {"Authorization": f"Bearer {run.deployment.admin_token}"}
    if method in _MUTATING:
        headers["Idempotency-Key"] = str(uuid.uuid4())
    answer = await run.http.request(method, run.url() + path, json=body, headers=headers)
    if answer.status_code >= 300:
        raise StepFailed(f"{method} {path}: status {answer.status_code}: {answer.text[:200]}")
    return answer.json() if answer.content else None


async def audit_mark(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """Each audit chain's last sequence number now: an ``audit`` check's
    ``since`` counts only events after it."""
    marks: dict[str, int] = {}
    for event in await run.audit_events():
        marks[event["chain"]] = max(marks.get(event["chain"], 0), int(event["seq"]))
    return marks


async def query(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """A value of the durable state at this moment: ``sql`` with ``params``."""
    return await run.scalar(str(spec["sql"]), run.render(spec.get("params", {})))


async def tamper(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """Write the database behind the server's back (``sql``, ``params``):
    an injected fault, recorded as such."""
    database = await run.database()
    async with database.write() as tx:
        await tx.execute(sa.text(str(spec["sql"])), run.render(spec.get("params", {})))
    run.inject("tamper", f"direct SQL write: {' '.join(str(spec['sql']).split())[:120]}")


async def sleep(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """Let real time pass (``seconds``): leases lapse on the server's clock."""
    await asyncio.sleep(float(spec["seconds"]))


async def start_server(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """Start a server process (``server``, default all) and wait until it is ready."""
    index = spec.get("server")
    await run.deployment.start(None if index is None else int(index))
    return {"url": run.url(), "admin_token_printed": run.deployment.admin_token is not None}


async def kill_server(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """SIGKILL a server process (``server``, default 0): an injected fault."""
    index = int(spec.get("server", 0))
    run.deployment.kill(index)
    run.inject("server-killed", f"SIGKILL to server {index} at {run.current_step}")


async def cli(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """Run the ``buildmax`` CLI (``argv`` after ``buildmax``) pointed at the
    journey's config, and ``as`` an actor over HTTP; ``expect_exit`` (default
    0, ``"any"`` for no check). Saves ``exit`` and ``output``."""
    argv = [str(a) for a in run.render(spec["argv"])]
    env = {**os.environ, **run.environment(), "BUILDMAX_URL": run.url()}
    env.pop("BUILDMAX_TOKEN", None)
    token = run.token(run.render(spec.get("as")))
    if token:
        env["BUILDMAX_TOKEN"] = token
    label = f"buildmax {' '.join(argv[:2])}"
    done = await command_step(
        label,
        [*BUILDMAX, *argv],
        run,
        env=env,
        seconds=float(spec.get("timeout", 300)),
        expect_exit=spec.get("expect_exit", 0),
    )
    return {"exit": done.status, "output": done.stdout}


async def command_step(
    label: str,
    argv: Sequence[str],
    run: JourneyRun,
    *,
    env: Mapping[str, str],
    seconds: float,
    expect_exit: int | str = 0,
    merge_output: bool = True,
) -> Finished:
    """Run a command as a step does, in the journey's directory: a command
    still running after ``seconds``, or one ending with a status other
    than ``expect_exit`` (``"any"``: no check), fails the step naming it."""
    try:
        done = await run_command(
            argv, cwd=run.workdir, env=env, seconds=seconds, merge_output=merge_output
        )
    except TimeoutError:
        raise StepFailed(f"{label}: no end after {seconds:g} s") from None
    if expect_exit != "any" and done.status != int(expect_exit):
        raise StepFailed(f"{label}: exit {done.status}, expected {expect_exit}: {done.last_line}")
    return done


async def write_file(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """Write a file under the journey's directory: ``text``, or ``size``
    bytes from a seeded generator; saves ``path``, ``size`` and ``sha256``."""
    path = str(run.render(spec["path"]))
    if "text" in spec:
        data = str(run.render(spec["text"])).encode()
    else:
        data = random.Random(int(spec.get("seed", 0))).randbytes(int(spec["size"]))
    target = run.workdir / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


async def fault(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """Arm (``armed = true``) or clear a switch of the test-only fault
    plugin (``fault``: ``blob-put-after-store``). Arming is recorded."""
    name = str(spec["fault"])
    switch = run.deployment.faults_dir / name
    if spec.get("armed", True):
        switch.write_text("armed\n")
        run.inject(name, str(spec.get("injection_point", f"{name} armed at {run.current_step}")))
    else:
        switch.unlink(missing_ok=True)


def _send_and_drop(host: str, port: int, payload: bytes, timeout: float) -> bool:
    with socket.create_connection((host, port), timeout=timeout) as conn:
        conn.sendall(payload)
        ready, _, _ = select.select([conn], [], [], timeout)
        # Reset, not close: the answer waiting in the socket is never read.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return bool(ready)


async def drop_answer(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """Send a request like ``request`` does, wait until its answer is
    waiting on the socket (the server committed and answered), then reset
    the connection without reading it: the client never learns the outcome.
    An injected fault; saves the idempotency key it used."""
    method, url, kwargs = _request_parts(run, spec)
    built = httpx.Request(method, url, **kwargs)
    head = [
        f"{method} {built.url.raw_path.decode()} HTTP/1.1",
        f"Host: {built.url.netloc.decode()}",
    ]
    head += [f"{k}: {v}" for k, v in built.headers.items() if k.lower() != "host"]
    head += ["Connection: close"]
    payload = ("\r\n".join(head) + "\r\n\r\n").encode() + built.read()
    answered = await asyncio.to_thread(
        _send_and_drop,
        built.url.host,
        built.url.port or 80,
        payload,
        float(spec.get("timeout", 30)),
    )
    path = built.url.raw_path.decode()
    run.inject(
        "dropped-answer",
        f"connection reset before reading the answer to {method} {path}"
        + ("" if answered else " (no answer came within the timeout)"),
    )
    if not answered:
        raise StepFailed(f"{method} {path}: no answer within the timeout")
    return {"idempotency_key": built.headers.get("idempotency-key")}


async def python(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """Call ``module:function`` of the qualification's ``steps/`` directory
    with the journey run and the rendered ``args``."""
    module_name, _, function_name = str(spec["call"]).partition(":")
    if run.steps_dir is None:
        raise HarnessError("no steps directory beside the journeys directory")
    path = run.steps_dir / f"{module_name}.py"
    qualified = f"buildmax_qualification_steps.{module_name}"
    module = sys.modules.get(qualified)
    if module is None:
        loader = importlib.util.spec_from_file_location(qualified, path)
        if loader is None or loader.loader is None or not path.exists():
            raise HarnessError(f"no step module {path}")
        module = importlib.util.module_from_spec(loader)
        sys.modules[qualified] = module
        try:
            loader.loader.exec_module(module)
        except BaseException:
            del sys.modules[qualified]  # a half-loaded module is not reused
            raise
    function = getattr(module, function_name, None)
    if function is None:
        raise HarnessError(f"{path.name} has no step {function_name!r}")
    return await function(run, **run.render(spec.get("args", {})))


#: Step kinds by the name a journey file uses.
STEPS: dict[str, StepFunction] = {
    "request": request,
    "race": race,
    "principal": principal,
    "space": space,
    "audit_mark": audit_mark,
    "query": query,
    "tamper": tamper,
    "sleep": sleep,
    "start_server": start_server,
    "kill_server": kill_server,
    "cli": cli,
    "write_file": write_file,
    "fault": fault,
    "drop_answer": drop_answer,
    "python": python,
    "mcp": tool_call,
}

#: What a step kind checks of its table when the journey file loads: a
#: ``ValueError`` naming the key it cannot use.
STEP_CHECKS: dict[str, Callable[[Mapping[str, Any]], None]] = {
    "mcp": check_mcp,
}


def check_step(kind: str, spec: Mapping[str, Any]) -> None:
    """Check a step's table before any server starts (``ValueError``)."""
    checker = STEP_CHECKS.get(kind)
    if checker is not None:
        checker(spec)


def steps_directory(journeys_dir: Path) -> Path | None:
    """The ``steps/`` directory beside a journeys directory, if any."""
    candidate = journeys_dir.parent / "steps"
    return candidate if candidate.is_dir() else None
