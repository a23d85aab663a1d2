"""The administration pages: principals and their tokens, the person's own
tokens, a space's members and its holds.

Each page reads through the API's own routes as the signed-in person, and
each form is performed by the route an API client would call, so the
route decides who may (a system admin creates and disables principals and
manages anyone's tokens; a space admin manages members and holds; only an
owner grants the owner role) and audits the change with the person as its
actor. A page offers a control only to those the route would let use it;
a refusal shows the page again with the problem and its status.

A token's secret exists once: in the answer to the post that created or
rotated it, which shows the page at once (never a redirect to a page that
could show it again). It is never put in a URL, logged or shown later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from quart import Response, request

from buildmax.problems import Conflict, NotFound, Problem
from buildmax.roles import PRINCIPAL_KINDS, SPACE_ROLES, SYSTEM_ROLES

from . import admin_forms, admin_views
from .session import checked_form
from .web import (
    api,
    blueprint,
    html,
    page,
    redirect,
    render,
    request_key,
    seg,
    signed_in,
    space_path,
    ui_path,
)

#: A page shown again after a post: its body for a refusal (``problem``)
#: or for a new token (``issued``).
Again = Callable[..., Awaitable[str]]


def _principal_url(ref: str) -> str:
    return f"/ui/principals/{seg(ref)}"


def _done(target: str, what: str) -> Response:
    """Back to ``target`` after a change, with the notice of ``what``."""
    return redirect(f"{target}?" + urlencode({"done": what}), 303)


def _cursor() -> str | None:
    return request.args.get("cursor") or None


def _notice() -> str | None:
    return admin_forms.done(request.args.get("done"))


async def _refused(again: Again, refused: Problem, **context: Any) -> Response:
    """The page again, with the API's refusal and its status."""
    return html(await again(problem=refused, **context), refused.status)


# ----------------------------------------------------------------------------- principals


async def _principals(*, problem: Problem | None = None, form: dict[str, str] | None = None) -> str:
    shown = await admin_views.principals_view(api(), _cursor())
    return await render(
        "principals.html",
        problem=problem,
        form=form or {},
        notice=_notice(),
        kinds=PRINCIPAL_KINDS,
        system_roles=SYSTEM_ROLES,
        **shown,
    )


@blueprint.get("/ui/principals")
@page
async def principals_page() -> str:
    """Every principal, a page at a time; for system admins, the form that
    creates one and, per principal, disable or enable."""
    return await _principals()


@blueprint.post("/ui/principals")
@page
async def create_principal() -> Response:
    """Create a principal (``POST /v1/principals``); on to its page, where
    an agent gets its first token."""
    form = await checked_form(signed_in())
    try:
        created = await api().request(
            "POST", "/v1/principals", json=admin_forms.principal_body(form)
        )
    except Problem as refused:
        return await _refused(_principals, refused, form=admin_forms.echo(form))
    return _done(_principal_url(created["id"]), "created")


@blueprint.post("/ui/principals/<ref>/disabled")
@page
async def set_disabled(ref: str) -> Response:
    """Disable (``disabled=true``) or enable a principal (``PATCH
    /v1/principals/{ref}``); back to the list or the principal's page,
    whichever posted (``back=list``)."""
    form = await checked_form(signed_in())
    disabled = form.get("disabled") == "true"
    from_list = form.get("back") == "list"
    again: Again = _principals if from_list else _principal_again(ref)
    try:
        await api().request("PATCH", f"/v1/principals/{seg(ref)}", json={"disabled": disabled})
    except Problem as refused:
        return await _refused(again, refused)
    target = "/ui/principals" if from_list else _principal_url(ref)
    return _done(target, "disabled" if disabled else "enabled")


def _principal_again(ref: str) -> Again:
    async def again(*, problem: Problem | None = None, issued: dict[str, Any] | None = None) -> str:
        shown = await admin_views.principal_view(api(), ref, _cursor())
        return await _token_page("principal.html", shown, problem, issued)

    return again


@blueprint.get("/ui/principals/<ref>")
@page
async def principal_page(ref: str) -> str:
    """A principal and its tokens; for system admins, disable or enable it
    and create, revoke and rotate its tokens."""
    return await _principal_again(ref)()


@blueprint.post("/ui/principals/<ref>/tokens")
@page
async def create_token_for(ref: str) -> Response:
    """Create a token for the principal (``POST /v1/tokens`` with
    ``principal_id``): its secret is on this answer only."""
    form = await checked_form(signed_in())
    body = admin_forms.token_body(form, ref)
    return await _issue(_principal_again(ref), "/v1/tokens", body, request_key(form))


@blueprint.post("/ui/principals/<ref>/tokens/<token>/revoke")
@page
async def revoke_token_of(ref: str, token: str) -> Response:
    """Revoke one of the principal's tokens (``DELETE /v1/tokens/{token}``)."""
    await checked_form(signed_in())
    await _token_of(ref, token)
    return await _revoke(_principal_again(ref), _principal_url(ref), token)


@blueprint.post("/ui/principals/<ref>/tokens/<token>/rotate")
@page
async def rotate_token_of(ref: str, token: str) -> Response:
    """Rotate one of the principal's tokens (``POST
    /v1/tokens/{token}/rotate``): the new secret is on this answer only."""
    form = await checked_form(signed_in())
    await _token_of(ref, token)
    _not_this_session(token)
    path = f"/v1/tokens/{seg(token)}/rotate"
    return await _issue(_principal_again(ref), path, None, request_key(form))


async def _token_of(ref: str, token: str) -> None:
    """404 unless ``token`` is a token of the principal ``ref`` (a page acts
    on its own principal's tokens only)."""
    principal, shown = await asyncio.gather(
        api().get(f"/v1/principals/{seg(ref)}"), api().get(f"/v1/tokens/{seg(token)}")
    )
    if shown["principal_id"] != principal["id"]:
        raise NotFound("no such token of this principal")


def _not_this_session(token: str) -> None:
    """Rotating the session this very request signed in with would end it
    halfway: the person signs out instead."""
    if token == signed_in().caller.actor.token_id:
        raise Conflict("this is your sign-in session: sign out to end it")


# ----------------------------------------------------------------------------- tokens


async def _tokens(*, problem: Problem | None = None, issued: dict[str, Any] | None = None) -> str:
    shown = await admin_views.tokens_view(api(), _cursor())
    return await _token_page("tokens.html", shown, problem, issued)


async def _token_page(
    template: str,
    shown: dict[str, Any],
    problem: Problem | None,
    issued: dict[str, Any] | None,
) -> str:
    """A page with a token list and the token form (a principal's, or the
    person's own), and the new secret when one was just issued."""
    return await render(
        template,
        problem=problem,
        issued=issued,
        notice=_notice(),
        lifetimes=admin_forms.LIFETIMES,
        default_lifetime=admin_forms.DEFAULT_LIFETIME,
        **shown,
    )


@blueprint.get("/ui/tokens")
@page
async def tokens_page() -> str:
    """The person's own tokens (sessions marked, this one as such), with
    create, revoke and rotate."""
    return await _tokens()


@blueprint.post("/ui/tokens")
@page
async def create_token() -> Response:
    """Create a token for the person (``POST /v1/tokens``): its secret is
    on this answer only."""
    form = await checked_form(signed_in())
    body = admin_forms.token_body(form, None)
    return await _issue(_tokens, "/v1/tokens", body, request_key(form))


@blueprint.post("/ui/tokens/<token>/revoke")
@page
async def revoke_token(token: str) -> Response:
    """Revoke one of the person's tokens (``DELETE /v1/tokens/{token}``)."""
    await checked_form(signed_in())
    return await _revoke(_tokens, "/ui/tokens", token)


@blueprint.post("/ui/tokens/<token>/rotate")
@page
async def rotate_token(token: str) -> Response:
    """Rotate one of the person's tokens (``POST /v1/tokens/{token}/rotate``):
    the new secret is on this answer only."""
    form = await checked_form(signed_in())
    _not_this_session(token)
    return await _issue(_tokens, f"/v1/tokens/{seg(token)}/rotate", None, request_key(form))


async def _issue(again: Again, path: str, body: dict[str, Any] | None, key: str | None) -> Response:
    """Create or rotate a token and answer with the page showing its secret,
    this once (201, as the API answers); a refusal shows the page again.
    ``key`` is the form's idempotency key: the same form posted again (a
    reload) makes no second token; the API revokes the secret of the first
    answer, unseen now, and shows a fresh one."""
    try:
        issued = await api().request("POST", path, json=body, idempotency_key=key)
    except Problem as refused:
        return await _refused(again, refused)
    return html(await again(issued=issued), 201)


async def _revoke(again: Again, back: str, token: str) -> Response:
    """Revoke ``token``; back to ``back``, or the page again with the refusal."""
    try:
        await api().request("DELETE", f"/v1/tokens/{seg(token)}")
    except Problem as refused:
        return await _refused(again, refused)
    return _done(back, "revoked")


# ----------------------------------------------------------------------------- members


def _members_again(space: str) -> Again:
    async def again(*, problem: Problem | None = None, form: dict[str, str] | None = None) -> str:
        shown = await admin_views.members_view(api(), space, _cursor())
        return await render(
            "members.html",
            problem=problem,
            form=form or {},
            notice=_notice(),
            roles=SPACE_ROLES,
            **shown,
        )

    return again


@blueprint.get("/ui/spaces/<space>/members")
@page
async def members_page(space: str) -> str:
    """A space's members and their roles; for space admins, add a member,
    change a role, remove a member."""
    return await _members_again(space)()


@blueprint.post("/ui/spaces/<space>/members")
@page
async def put_member(space: str) -> Response:
    """Add a member or change a role (``PUT
    /v1/spaces/{space}/members/{principal}``)."""
    form = await checked_form(signed_in())
    try:
        principal, body = admin_forms.member_put(form)
        await api().request("PUT", space_path(space, "members", principal), json=body)
    except Problem as refused:
        return await _refused(_members_again(space), refused, form=admin_forms.echo(form))
    return _done(ui_path(space, "members"), "saved")


@blueprint.post("/ui/spaces/<space>/members/remove")
@page
async def remove_member(space: str) -> Response:
    """Remove a member (``DELETE /v1/spaces/{space}/members/{principal}``),
    or leave the space (any member, the person named): back to the
    overview."""
    form = await checked_form(signed_in())
    try:
        principal = admin_forms.member_named(form)
        await api().request("DELETE", space_path(space, "members", principal))
    except Problem as refused:
        return await _refused(_members_again(space), refused)
    if principal == signed_in().caller.actor.principal_id:
        # The person left: the space is no longer theirs to see.
        return _done("/ui/", "left")
    return _done(ui_path(space, "members"), "removed")


# ----------------------------------------------------------------------------- holds


def _holds_again(space: str) -> Again:
    async def again(*, problem: Problem | None = None, form: dict[str, str] | None = None) -> str:
        shown = await admin_views.holds_view(api(), space, _cursor())
        return await render(
            "holds.html", problem=problem, form=form or {}, notice=_notice(), **shown
        )

    return again


@blueprint.get("/ui/spaces/<space>/holds")
@page
async def holds_page(space: str) -> str:
    """A space's live holds and those lifted lately; for space admins, place
    a hold on the space or a project, lift a hold."""
    return await _holds_again(space)()


@blueprint.post("/ui/spaces/<space>/holds")
@page
async def place_hold(space: str) -> Response:
    """Place a hold (``POST /v1/spaces/{space}/holds``)."""
    form = await checked_form(signed_in())
    try:
        await api().request("POST", space_path(space, "holds"), json=admin_forms.hold_body(form))
    except Problem as refused:
        return await _refused(_holds_again(space), refused, form=admin_forms.echo(form))
    return _done(ui_path(space, "holds"), "placed")


@blueprint.post("/ui/spaces/<space>/holds/<hold>/lift")
@page
async def lift_hold(space: str, hold: str) -> Response:
    """Lift a hold (``POST /v1/spaces/{space}/holds/{hold}/lift``)."""
    await checked_form(signed_in())
    try:
        await api().request("POST", space_path(space, "holds", hold, "lift"))
    except Problem as refused:
        return await _refused(_holds_again(space), refused)
    return _done(ui_path(space, "holds"), "lifted")
