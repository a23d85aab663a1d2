"""The dashboard's pages under ``/ui/``.

Each page authenticates the session cookie, reads what it shows through the
API's own routes called in-process as the signed-in person
(:class:`buildmax.internal.InternalApi`), and renders a template. Every
action posts a form that carries the CSRF token and is performed by the
same route an API client would call, so role checks, validation, audit
events (marked ``ui/<request id>``) and stream events are the API's. A
problem the API answers becomes an error page with its status: a stranger
to a space gets the same 404 as over the API.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from quart import Response, g, render_template, request

from buildmax import sessions
from buildmax.access import require_space
from buildmax.auth import still_authorized
from buildmax.current import current_buildmax
from buildmax.events import event_stream_response
from buildmax.problems import Problem, TooManyRequests, Unauthenticated
from buildmax.schemas import SessionCreate

from . import actions, artifacts, board, reviews
from .session import (
    CSRF_FIELD,
    SESSION_COOKIE,
    SIGN_IN_COOKIE,
    checked_form,
    checked_sign_in_form,
    end_cookie,
    new_sign_in_token,
    session_secret,
    set_cookie,
    start_session,
)
from .web import api, blueprint, html, page, redirect, render, safe_next, signed_in

# ----------------------------------------------------------------------------- sign-in


@blueprint.get("/ui/sign-in")
async def sign_in_form() -> Response:
    """The sign-in form (with its CSRF cookie)."""
    return await _sign_in_page(status=200, message=None, name="")


async def _sign_in_page(status: int, message: str | None, name: str) -> Response:
    token = new_sign_in_token()
    body = await render_template(
        "dashboard/sign_in.html",
        session=None,
        csrf_field=CSRF_FIELD,
        csrf=token,
        message=message,
        name=name,
        next=safe_next(request.args.get("next", "/ui/")),
    )
    response = Response(body, status=status, content_type="text/html; charset=utf-8")
    set_cookie(response, SIGN_IN_COOKIE, token, max_age=3600)
    return response


@blueprint.post("/ui/sign-in")
async def sign_in() -> Response:
    """Sign in with name and password: the session cookie, then the page
    the person was going to."""
    form = await checked_sign_in_form()
    name, password = form.get("name", ""), form.get("password", "")
    if SessionCreate().validate({"name": name, "password": password}):
        return await _sign_in_page(400, "Enter your name and password.", name[:64])
    target = safe_next(form.get("next", "/ui/"))
    try:
        signed_in = await sessions.sign_in(name, password, g.client_address)
    except Unauthenticated:
        return await _sign_in_page(401, "Wrong name or password.", name)
    except TooManyRequests as refused:
        response = await _sign_in_page(429, f"{refused.detail}.", name)
        response.headers.update(refused.headers)
        return response
    response = redirect(target, 303)
    start_session(response, signed_in.issued.secret)
    return response


@blueprint.post("/ui/sign-out")
@page
async def sign_out() -> Response:
    """Revoke the session and forget its cookie."""
    session = signed_in()
    await checked_form(session)
    await sessions.sign_out(session.caller.actor)
    response = redirect("/ui/sign-in", 303)
    end_cookie(response, SESSION_COOKIE)
    return response


# ----------------------------------------------------------------------------- pages


@blueprint.get("/ui/")
@page
async def overview() -> str:
    """Every space the person may see, each with its attention list."""
    spaces = await board.spaces_with_attention(api())
    return await render("overview.html", spaces=spaces, left=request.args.get("done") == "left")


@blueprint.get("/ui/spaces/<space>/")
@page
async def space_page(space: str) -> str:
    """One space: its attention list, its projects (each a board), the
    decisions waiting."""
    shown = await board.space_view(api(), space)
    return await render("space.html", **shown)


@blueprint.get("/ui/spaces/<space>/projects/<project>/")
@page
async def board_page(space: str, project: str) -> str:
    """A project's tasks in columns by state, filtered as the query asks."""
    shown = await board.board_view(api(), space, project, request.args)
    return await render("board.html", **shown)


@blueprint.get("/ui/spaces/<space>/tasks/<task>")
@page
async def task_page(space: str, task: str) -> str:
    """Everything about one task."""
    shown = await board.task_view(api(), space, task)
    done = request.args.get("done")
    return await render(
        "task.html", problem=None, done=done if done in _TASK_DONE else None, **shown
    )


#: What a task's page says was just done to it.
_TASK_DONE = (*actions.ACTIONS, "created")


@blueprint.post("/ui/spaces/<space>/tasks/<task>/<action>")
@page
async def task_action(space: str, task: str, action: str) -> Response:
    """Take an action on a task (cancel, retry, hold, lift a hold, cancel
    an attempt) through the tasks plugin's route, as the person; back to the
    page the form names in ``next`` (a board's move), else the task's page,
    which shows the refusal if the route refused."""
    form = await checked_form(signed_in())
    path, body = actions.call_for(action, task, form)
    here = f"/ui/spaces/{quote(space, safe='')}/tasks/{quote(task, safe='')}"
    try:
        await api().request("POST", f"/v1/spaces/{quote(space, safe='')}{path}", json=body)
    except Problem as refused:
        shown = await board.task_view(api(), space, task)
        page_body = await render("task.html", problem=refused, done=None, **shown)
        return html(page_body, refused.status)
    back = form.get("next", "")
    target = back if back and safe_next(back) == back else here
    return redirect(_with_done(target, action), 303)


def _with_done(target: str, action: str) -> str:
    """``target`` saying that ``action`` was just done (once: a ``done`` it
    said before is dropped)."""
    path, _, query = target.partition("?")
    kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "done"]
    return f"{path}?" + urlencode([*kept, ("done", action)])


@blueprint.get("/ui/spaces/<space>/reviews/<work>")
@page
async def review_page(space: str, work: str) -> str:
    """A review work item: the submission (diffs first) and, for members,
    the form that records a human review."""
    shown = await board.review_view(api(), space, work)
    return await render("review.html", form=None, problem=None, **shown)


@blueprint.post("/ui/spaces/<space>/reviews/<work>/record")
@page
async def record_review(space: str, work: str) -> Response:
    """Record the person's review with its findings, as a human review,
    through the reviews plugin's route (which claims the unheld work item
    and hands it in at once). A refusal shows the form again, as filled."""
    form = await checked_form(signed_in())
    posted = await request.form
    body, problem = reviews.review_body(form, posted)
    if problem is None:
        try:
            await api().request(
                "POST",
                f"/v1/spaces/{quote(space, safe='')}/reviews/{quote(work, safe='')}",
                json=body,
            )
        except Problem as refused:
            problem = refused
    if problem is not None:
        shown = await board.review_view(api(), space, work)
        page_body = await render(
            "review.html", form=reviews.echo(form, posted), problem=problem, **shown
        )
        return html(page_body, problem.status)
    return redirect(f"/ui/spaces/{quote(space, safe='')}/reviews/{quote(work, safe='')}", 303)


@blueprint.get("/ui/spaces/<space>/artifacts/<artifact>/content")
@page
async def artifact_content(space: str, artifact: str) -> Response:
    """An artifact's bytes, relayed from the artifacts plugin's download
    route as the signed-in person, chunk by chunk, with its headers (an
    attachment unless it is an image or plain text; a sandbox policy)."""
    forwarded = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED}
    opened = api().stream(artifacts.content_path(space, artifact), headers=forwarded)
    answer = await opened.__aenter__()

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in answer.body:
                yield chunk
        finally:
            await opened.__aexit__(None, None, None)

    response = Response(body(), status=answer.status)
    for name in _RELAYED:
        if name in answer.headers:
            response.headers[name] = answer.headers[name]
    response.timeout = None
    return response


#: Request headers a download passes on (ranges, revalidation).
_FORWARDED = frozenset({"range", "if-none-match", "if-range"})
#: Answer headers a download relays.
_RELAYED = (
    "Content-Type",
    "Content-Length",
    "Content-Range",
    "Content-Disposition",
    "ETag",
    "Accept-Ranges",
    "Content-Security-Policy",
    "X-Content-Type-Options",
)


@blueprint.get("/ui/spaces/<space>/decisions")
@page
async def decisions_page(space: str) -> str:
    """The space's pending decisions, each with a form to answer it."""
    shown = await board.decisions_view(api(), space)
    return await render("decisions.html", answered=request.args.get("answered"), **shown)


@blueprint.post("/ui/spaces/<space>/decisions/<decision>/answer")
@page
async def answer_decision(space: str, decision: str) -> Response:
    """Answer a decision as the signed-in person (the API's route decides
    whether they may)."""
    form = await checked_form(signed_in())
    body = {"answer": form.get("answer", ""), "comment": form.get("comment") or None}
    await api().request(
        "POST",
        f"/v1/spaces/{quote(space, safe='')}/decisions/{quote(decision, safe='')}/answer",
        json=body,
    )
    target = f"/ui/spaces/{quote(space, safe='')}/decisions?" + urlencode({"answered": decision})
    return redirect(target, 303)


@blueprint.get("/ui/spaces/<space>/events")
@page
async def space_events(space: str) -> Response:
    """The pages' own event stream of a space (the session cookie works
    here, where ``EventSource`` can send no header): one ``changed`` event
    per event of the space from now on (or from ``Last-Event-ID``), naming
    only its type, so a page knows to refresh. Access is checked as the
    API's stream checks it, again before every batch."""
    session = signed_in()
    access = await require_space(space, "viewer", session.caller, "space.events.read")
    app = current_buildmax()
    resume = request.headers.get("Last-Event-ID", "")
    after = int(resume) if _EVENT_ID.fullmatch(resume) else await app.events.last_seq(access.pk)
    secret = session_secret()
    return event_stream_response(
        app,
        access.pk,
        after,
        lambda: still_authorized(app, secret, access.pk, session.caller),
        _changed,
    )


#: A ``Last-Event-ID`` a page's stream resumes from (an event id, in range).
_EVENT_ID = re.compile(r"[0-9]{1,18}")


def _changed(row: dict[str, Any]) -> bytes:
    data = json.dumps({"type": row["type"]}, separators=(",", ":"))
    return f"id: {row['seq']}\nevent: changed\ndata: {data}\n\n".encode()
