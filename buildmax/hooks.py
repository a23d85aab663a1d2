"""The hooks of the contract, called through one typed method each.

Every call of a hook goes through :class:`Hooks` (``app.hooks``): its
methods take the hook's arguments by name and type and return what the
implementations answered, ``None`` dropped, in pluggy's order. An async
implementation returns an awaitable, which the async methods await here and
nowhere else. Hooks whose answers the kernel needs per plugin (blob stores,
services, workflow stages, shutdown) are called one implementation at a
time by :meth:`Hooks.each`, which ``BUILDMAX_TRACE_PLUGINS=1`` logs like
every other call. Hooks called inside a transaction also receive the app
the facade was attached to (:meth:`Hooks.attach`), so an implementation has
it whether the change came from a request or from a background job.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pluggy
from buildmax_hookspecs import (
    Actor,
    AgentRevisionRef,
    AgentTool,
    App,
    AttemptRef,
    Attention,
    AuditAction,
    AuditEvent,
    BlobRef,
    Gauge,
    GraderFactory,
    Importer,
    Migration,
    ReleaseRef,
    ResourceRef,
    Restoration,
    StageSpec,
    SubmissionRef,
    TaskRef,
    Transaction,
    Verdict,
)
from buildmax_hookspecs.storage import BlobStoreFactory

log = logging.getLogger("buildmax.plugins")


def _log_call(name: str, impls: Sequence[Any]) -> None:
    log.info("hook %s -> %s", name, [impl.plugin_name for impl in impls])


def _log_done(name: str) -> None:
    log.info("hook %s done", name)


class Hooks:
    """The app's hook calls (see the module docstring)."""

    def __init__(self, pm: pluggy.PluginManager, *, trace: bool = False) -> None:
        self._pm = pm
        self._trace = trace
        self._app: App | None = None
        if trace:
            pm.add_hookcall_monitoring(
                lambda name, impls, kwargs: _log_call(name, impls),
                lambda outcome, name, impls, kwargs: _log_done(name),
            )

    def attach(self, app: App) -> None:
        """Give ``app`` to every hook called inside a transaction."""
        self._app = app

    @property
    def app(self) -> App:
        """The attached app (hooks that change data need one)."""
        if self._app is None:
            raise RuntimeError("these hooks serve no app: create_app() attaches one")
        return self._app

    # -- how hooks are called ----------------------------------------------------

    def _call(self, name: str, **kwargs: Any) -> list[Any]:
        return list(getattr(self._pm.hook, name)(**kwargs))

    async def _acall(self, name: str, **kwargs: Any) -> list[Any]:
        pending = self._call(name, **kwargs)
        results = []
        try:
            while pending:
                result = pending.pop(0)
                if inspect.isawaitable(result):
                    result = await result
                if result is not None:
                    results.append(result)
        finally:
            for left in pending:  # after a failure: never started, never awaited
                if inspect.iscoroutine(left):
                    left.close()
        return results

    @contextlib.contextmanager
    def _implementations(self, name: str) -> Iterator[list[Any]]:
        """The implementations of hook ``name`` in registration order, for a
        caller that calls them one by one; traced like pluggy's own calls."""
        impls = getattr(self._pm.hook, name).get_hookimpls()
        if self._trace:
            _log_call(name, impls)
        yield impls
        if self._trace:
            _log_done(name)

    def each(self, name: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """``(plugin name, answer)`` of every implementation of the hook
        ``name``, in registration order, each given the arguments it names.
        An answer may be an awaitable, for the caller to await."""
        answers = []
        with self._implementations(name) as impls:
            for impl in impls:
                answer = impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
                if answer is not None:
                    answers.append((impl.plugin_name, answer))
        return answers

    # -- the app -----------------------------------------------------------------

    async def startup(self, app: App) -> None:
        """``buildmax_startup``: the app is starting, its database migrated."""
        await self._acall("buildmax_startup", app=app)

    async def shutdown(self, app: App) -> None:
        """``buildmax_shutdown``, plugin by plugin: one that fails is logged
        and the others still shut down."""
        with self._implementations("buildmax_shutdown") as impls:
            for impl in impls:
                try:
                    result = impl.function(**{arg: app for arg in impl.argnames})
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("plugin %r failed to shut down", impl.plugin_name)

    def blueprints(self, app: App) -> list[Any]:
        """``buildmax_blueprints``: every plugin's blueprints, in one list."""
        return [bp for found in self._call("buildmax_blueprints", app=app) for bp in found]

    def register_commands(self, cli: Any) -> None:
        """``buildmax_register_commands``: plugins add their commands to ``cli``."""
        self._call("buildmax_register_commands", cli=cli)

    def migrations(self) -> list[Migration]:
        """``buildmax_migrations``: every plugin's migrations, in one list."""
        return [m for found in self._call("buildmax_migrations") for m in found]

    def services(self, app: App) -> list[tuple[str, Mapping[type, Any]]]:
        """``buildmax_services``: ``(plugin, {Protocol: implementation})``."""
        return self.each("buildmax_services", app=app)

    def agent_tools(self) -> list[tuple[str, Iterable[AgentTool]]]:
        """``buildmax_agent_tools``: ``(plugin, its tools)``."""
        return self.each("buildmax_agent_tools")

    # -- audit ---------------------------------------------------------------------

    def audit_actions(self) -> list[AuditAction]:
        """``buildmax_audit_actions``: every declared action, in one list."""
        return [a for found in self._call("buildmax_audit_actions") for a in found]

    def audit_targets(self) -> list[Mapping[str, str]]:
        """``buildmax_audit_targets``: each plugin's target kinds."""
        return self._call("buildmax_audit_targets")

    async def audit_record(self, tx: Transaction, event: AuditEvent) -> None:
        """``buildmax_audit_record``: an event to write inside ``tx``."""
        await self._acall("buildmax_audit_record", app=self.app, tx=tx, event=event)

    # -- access ----------------------------------------------------------------------

    def permission(self, actor: Actor, action: str, resource: ResourceRef) -> list[bool]:
        """``buildmax_permission``: each plugin's allow (``True``) or deny."""
        return self._call("buildmax_permission", actor=actor, action=action, resource=resource)

    async def member_changed(
        self,
        tx: Transaction,
        *,
        space_id: str,
        principal_id: str,
        role: str | None,
        previous_role: str | None,
        actor: Actor,
    ) -> None:
        """``buildmax_member_changed``: a membership changed inside ``tx``."""
        await self._acall(
            "buildmax_member_changed",
            app=self.app,
            tx=tx,
            space_id=space_id,
            principal_id=principal_id,
            role=role,
            previous_role=previous_role,
            actor=actor,
        )

    # -- extensions --------------------------------------------------------------------

    def graders(self) -> list[Mapping[str, GraderFactory]]:
        """``buildmax_graders``: each plugin's graders by name."""
        return self._call("buildmax_graders")

    def importers(self) -> list[tuple[str, Iterable[Importer]]]:
        """``buildmax_importers``: ``(plugin, its importers)``."""
        return self.each("buildmax_importers")

    def blob_stores(self) -> list[tuple[str, Mapping[str, BlobStoreFactory]]]:
        """``buildmax_blob_stores``: ``(plugin, {scheme: factory})``."""
        return self.each("buildmax_blob_stores")

    # -- the workflow ------------------------------------------------------------------

    def workflow_stages(self) -> list[tuple[str, Iterable[StageSpec]]]:
        """``buildmax_workflow_stages``: ``(plugin, its stages)``."""
        return self.each("buildmax_workflow_stages")

    def submission_extensions(self) -> list[tuple[str, Iterable[str]]]:
        """``buildmax_submission_extensions``: ``(plugin, its names)``."""
        return self.each("buildmax_submission_extensions")

    async def stage_entered(
        self,
        tx: Transaction,
        *,
        subject: TaskRef,
        stage: str,
        work: Sequence[TaskRef],
        actor: Actor,
    ) -> None:
        """``buildmax_stage_entered``: a subject entered ``stage`` inside ``tx``."""
        await self._acall(
            "buildmax_stage_entered",
            app=self.app,
            tx=tx,
            subject=subject,
            stage=stage,
            work=work,
            actor=actor,
        )

    async def claim_check(self, tx: Transaction, task: TaskRef, principal: Actor) -> list[Verdict]:
        """``buildmax_claim_check``: each plugin's verdict on a claim."""
        return await self._acall(
            "buildmax_claim_check", app=self.app, tx=tx, task=task, principal=principal
        )

    async def submission_check(
        self,
        tx: Transaction,
        *,
        task: TaskRef,
        attempt: AttemptRef,
        submission: SubmissionRef,
        actor: Actor,
    ) -> list[Verdict]:
        """``buildmax_submission_check``: each plugin's verdict on a submission."""
        return await self._acall(
            "buildmax_submission_check",
            app=self.app,
            tx=tx,
            task=task,
            attempt=attempt,
            submission=submission,
            actor=actor,
        )

    async def attempt_submitted(
        self,
        tx: Transaction,
        *,
        task: TaskRef,
        attempt: AttemptRef,
        submission: SubmissionRef,
        actor: Actor,
    ) -> list[Verdict]:
        """``buildmax_attempt_submitted``: each plugin's verdict on a hand-in."""
        return await self._acall(
            "buildmax_attempt_submitted",
            app=self.app,
            tx=tx,
            task=task,
            attempt=attempt,
            submission=submission,
            actor=actor,
        )

    async def run_environment(
        self,
        tx: Transaction,
        *,
        task: TaskRef,
        attempt: AttemptRef,
        agent_revision: AgentRevisionRef | None,
    ) -> list[Mapping[str, Any]]:
        """``buildmax_run_environment``: what each plugin adds to a run."""
        return await self._acall(
            "buildmax_run_environment",
            app=self.app,
            tx=tx,
            task=task,
            attempt=attempt,
            agent_revision=agent_revision,
        )

    async def agent_revision(
        self, tx: Transaction, *, space_id: str, revision: AgentRevisionRef, actor: Actor
    ) -> list[Verdict]:
        """``buildmax_agent_revision``: each plugin's verdict on a new revision."""
        return await self._acall(
            "buildmax_agent_revision",
            app=self.app,
            tx=tx,
            space_id=space_id,
            revision=revision,
            actor=actor,
        )

    async def activation_policy(
        self, tx: Transaction, *, space_id: str, release: ReleaseRef, actor: Actor
    ) -> list[Verdict]:
        """``buildmax_activation_policy``: each plugin's verdict on an activation."""
        return await self._acall(
            "buildmax_activation_policy",
            app=self.app,
            tx=tx,
            space_id=space_id,
            release=release,
            actor=actor,
        )

    # -- backups -----------------------------------------------------------------------

    async def backup_blobs(self, conn: Transaction) -> AsyncIterator[BlobRef]:
        """``buildmax_backup_blobs``: every plugin's referenced blobs, one
        plugin after another, read in the backup's snapshot ``conn``."""
        for _plugin, blobs in self.each("buildmax_backup_blobs", conn=conn):
            async for ref in blobs:
                yield ref

    async def backup_facts(self, conn: Transaction) -> dict[str, Mapping[str, Any]]:
        """``buildmax_backup_facts``: each plugin's manifest facts, by plugin."""
        facts = {}
        for plugin, answer in self.each("buildmax_backup_facts", conn=conn):
            facts[plugin] = await answer if inspect.isawaitable(answer) else answer
        return facts

    async def backup_check(self, app: App, facts: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """``buildmax_backup_check``: every plugin's problems with a backup's
        database, given the facts it recorded (by plugin)."""
        problems: list[str] = []
        with self._implementations("buildmax_backup_check") as impls:
            for impl in impls:
                answer = impl.function(app=app, facts=facts.get(impl.plugin_name, {}))
                if inspect.isawaitable(answer):
                    answer = await answer
                problems.extend(answer or ())
        return problems

    async def restored(self, tx: Transaction, restoration: Restoration) -> list[str]:
        """``buildmax_restored``: every plugin's report lines on entering the
        restore's new epoch."""
        found = await self._acall("buildmax_restored", app=self.app, tx=tx, restoration=restoration)
        return [line for lines in found for line in lines]

    def restore_replay(self, path: str, facts: Mapping[str, Mapping[str, Any]]) -> list[AuditEvent]:
        """``buildmax_restore_replay``: the audit events after a backup, from
        the export at ``path`` (each plugin given the facts it recorded)."""
        events: list[AuditEvent] = []
        with self._implementations("buildmax_restore_replay") as impls:
            for impl in impls:
                found = impl.function(path=path, facts=facts.get(impl.plugin_name, {}))
                events.extend(found or ())
        return events

    async def gauges(self, conn: Transaction) -> list[tuple[str, Gauge]]:
        """``buildmax_gauges``: ``(plugin, gauge)`` for every gauge each
        plugin reports now."""
        found = []
        for plugin, answer in self.each("buildmax_gauges", app=self.app, conn=conn):
            found += [
                (plugin, g) for g in (await answer if inspect.isawaitable(answer) else answer)
            ]
        return found

    async def attention(
        self, conn: Transaction, now: int, space_pk: int | None = None
    ) -> list[Attention]:
        """``buildmax_attention``: what every plugin says needs a person now
        (in one space, or in all)."""
        found = await self._acall(
            "buildmax_attention", app=self.app, conn=conn, now=now, space_pk=space_pk
        )
        return [item for items in found for item in items]
