"""The BuildMax plugin contract.

Everything a plugin needs to talk to the kernel and to other plugins:
the pluggy markers, the hookspec modules, the records hooks pass and the
Protocols services implement. This package imports nothing of BuildMax.
"""

from . import app, audit, auth, backup, graders, operations, storage, tools, workflow
from .kernel import App, AuditTrail, Clock, Database, EventStream, ServiceRegistry, Settings
from .markers import PROJECT_NAME, hookimpl, hookspec
from .protocols import (
    BLOB_TMP_DIR,
    BlobDigestMismatch,
    BlobKeyError,
    BlobNotFound,
    BlobStore,
    BlobStoreUnavailable,
    BlobTooLarge,
    Grader,
    GraderFactory,
    GradingContext,
    Row,
    TaskQueue,
    Transaction,
    check_blob_key,
)
from .records import (
    ATTENTION_ROLES,
    SYSTEM_ACTOR,
    Actor,
    AgentRevisionRef,
    AgentTool,
    AttemptRef,
    Attention,
    AuditAction,
    AuditEvent,
    BlobRef,
    Gauge,
    Grade,
    Migration,
    ProjectRef,
    ReleaseRef,
    ResourceRef,
    Restoration,
    StageSpec,
    SubmissionRef,
    TaskRef,
    Verdict,
)
from .workflow import RunEnvironmentRefused

#: The modules holding hookspecs, in the order the kernel registers them.
HOOKSPEC_MODULES = (app, storage, audit, auth, workflow, graders, backup, operations, tools)

__all__ = [
    "ATTENTION_ROLES",
    "BLOB_TMP_DIR",
    "HOOKSPEC_MODULES",
    "PROJECT_NAME",
    "SYSTEM_ACTOR",
    "Actor",
    "AgentRevisionRef",
    "AgentTool",
    "App",
    "AttemptRef",
    "Attention",
    "AuditAction",
    "AuditEvent",
    "AuditTrail",
    "BlobDigestMismatch",
    "BlobKeyError",
    "BlobNotFound",
    "BlobRef",
    "BlobStore",
    "BlobStoreUnavailable",
    "BlobTooLarge",
    "Clock",
    "Database",
    "EventStream",
    "Gauge",
    "Grade",
    "Grader",
    "GraderFactory",
    "GradingContext",
    "Migration",
    "ProjectRef",
    "ReleaseRef",
    "ResourceRef",
    "Restoration",
    "Row",
    "RunEnvironmentRefused",
    "ServiceRegistry",
    "Settings",
    "StageSpec",
    "SubmissionRef",
    "TaskQueue",
    "TaskRef",
    "Transaction",
    "Verdict",
    "check_blob_key",
    "hookimpl",
    "hookspec",
]
