"""Search quality on a corpus of over 1,000 lessons, on both engines.

The corpus is generated from a seed: technical sentences drawn from a
vocabulary, spread over the projects ``main`` and ``web`` and the common
collection, the five kinds, task kinds, tags and paths; among them the
needles, lessons whose words the tests search for. The bulk is published
by the plugin's own ``create`` (the rows, index entries and audit events
a ``POST /lessons`` writes, a few hundred to a transaction), the needles
over HTTP, so every test has a corpus of its own to correct, supersede and
vote on.

Every needle word below is one the vocabulary never uses, and each is
stemmed alike by SQLite's Porter and PostgreSQL's Snowball stemmers and is
no English stop word, so both engines find the same lessons.
"""

from __future__ import annotations

import random
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any
from urllib.parse import urlencode

import pytest
from buildmax_hookspecs import Actor
from buildmax_lessons import lessons
from buildmax_lessons.schemas import LessonIn

from buildmax.testing import SpaceHandle

from .conftest import Lab

MARKED = re.compile("\x02([^\x02\x03]*)\x03")

# The vocabulary of the generated bulk. No word of it is a needle word, and
# "lock" is never followed by "timeout" (the phrase a test looks for).
NOUNS = (
    "cache",
    "queue",
    "worker",
    "schema",
    "index",
    "token",
    "session",
    "build",
    "artifact",
    "pipeline",
    "container",
    "image",
    "volume",
    "socket",
    "config",
    "cluster",
    "replica",
    "shard",
    "lease",
    "handler",
    "endpoint",
    "payload",
    "fixture",
    "snapshot",
    "webhook",
    "runner",
    "branch",
    "bucket",
    "certificate",
    "proxy",
    "scheduler",
    "journal",
    "manifest",
)
VERBS = (
    "check",
    "pin",
    "rotate",
    "flush",
    "warm",
    "restart",
    "drain",
    "bump",
    "rebuild",
    "validate",
    "compress",
    "mirror",
    "trim",
)
ADJECTIVES = (
    "stale",
    "slow",
    "large",
    "cold",
    "partial",
    "nested",
    "shared",
    "private",
    "broken",
    "empty",
    "noisy",
)
SENTENCES = (
    "{Verb} the {noun} before you {verb} the {noun2}.",
    "A {adj} {noun} makes the {noun2} {adj2}.",
    "Two {noun}s can share one {noun2} when it is {adj}.",
    "Retry the {noun} request when the connection drops.",
    "Take a lock on the {noun} first.",
    "The timeout of the {noun} is too short under load.",
    "A flaky {noun} test hides a real {noun2} bug.",
    "Connections to the {noun} leak when the {noun2} restarts.",
    "Never {verb} a {adj} {noun} by hand.",
)
TITLES = (
    "{Verb} the {noun} first",
    "The {adj} {noun}",
    "{Verb} every {noun} of the {noun2}",
    "When the {noun} is {adj}",
)
PROJECTS = ("main", "web", None)
KINDS = ("gotcha", "convention", "how-to", "decision", "note")
TASK_KINDS = ("code", "review", "integration", "general")
TAGS = ("db", "ci", "infra", "frontend", "security", "perf")
PATHS = ("src/**", "src/api/*.py", "tests/**", "migrations/**", "web/*.ts", "docs")
BULK = 1_000
SEED = 24


@dataclass(frozen=True)
class Spec:
    """A lesson to publish: where it lives and what it says."""

    title: str
    text: str
    project: str | None = "main"
    kind: str = "note"
    task_kinds: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()

    def body(self) -> dict[str, Any]:
        """The lesson as ``POST /lessons`` takes it."""
        return {
            "project": self.project,
            "kind": self.kind,
            "title": self.title,
            "text": self.text,
            "applies_to": {
                "task_kinds": list(self.task_kinds),
                "tags": list(self.tags),
                "paths": list(self.paths),
            },
        }

    def words(self) -> set[str]:
        """Every word of its title and text, lowercased."""
        return set(re.findall(r"[a-z0-9]+", (self.title + " " + self.text).lower()))


def _fill(rng: random.Random, template: str) -> str:
    verb = rng.choice(VERBS)
    noun, noun2 = rng.sample(NOUNS, 2)
    adj, adj2 = rng.sample(ADJECTIVES, 2)
    return template.format(
        Verb=verb.capitalize(),
        verb=rng.choice(VERBS),
        noun=noun,
        noun2=noun2,
        adj=adj,
        adj2=adj2,
    )


def generated(seed: int = SEED, count: int = BULK) -> list[Spec]:
    """The bulk of the corpus: ``count`` lessons from ``seed``."""
    rng = random.Random(seed)
    found = []
    for _ in range(count):
        title = _fill(rng, rng.choice(TITLES))
        text = " ".join(_fill(rng, rng.choice(SENTENCES)) for _ in range(rng.randint(2, 5)))
        found.append(
            Spec(
                title=title[0].upper() + title[1:],
                text=text,
                project=rng.choice(PROJECTS),
                kind=rng.choice(KINDS),
                task_kinds=tuple(rng.sample(TASK_KINDS, rng.randint(0, 2))),
                tags=tuple(rng.sample(TAGS, rng.randint(0, 2))),
                paths=tuple(rng.sample(PATHS, rng.choice((0, 0, 1, 2)))),
            )
        )
    return found


#: The needles, by name: lessons with known words the tests search for.
NEEDLES: dict[str, Spec] = {
    # Stemming: "retry flaky connection" finds "Retrying flaky connections".
    "retrying": Spec(
        "Retrying flaky connections to the database",
        "When the database drops connections under load, retrying with backoff "
        "hides a flaky network.",
    ),
    "retry-decoy": Spec(
        "Backoff settings of the HTTP client",
        "The client waits between attempts. Its defaults were tuned for a datacenter. "
        "On a flaky office network they were too short, and the pool opened a new "
        "connection for every attempt, so raise the delay before each retry.",
        project="web",
    ),
    "migrating": Spec(
        "Migrations run before the deploy",
        "A deploy that starts before migrating the database fails its health checks.",
    ),
    # Phrases: "lock timeout" together, in the title and text, in the text
    # only, and both words apart.
    "phrase-title": Spec(
        "Set a lock timeout before ALTER TABLE",
        "Without a lock timeout the migration waits behind a long query.",
    ),
    "phrase-text": Spec(
        "Long queries hold up schema changes",
        "Give every schema change a short lock timeout so that it fails fast instead "
        "of queueing behind a long transaction and blocking every reader.",
    ),
    "phrase-apart": Spec(
        "Timeout while waiting for a lock",
        "The lock was held by a forgotten session, and the timeout fired after a minute.",
    ),
    # A title match against a text-only match of the same word.
    "title-hit": Spec(
        "Tombstone rows need a sweeper",
        "Deleted rows stay behind as markers until a sweeper job removes them.",
    ),
    "text-hit": Spec(
        "Deleted rows need a sweeper",
        "Deleted rows stay behind as tombstone markers until a sweeper job removes them.",
    ),
    # Two lessons exactly as relevant to "thumbnail": usefulness orders them.
    "useful-a": Spec(
        "Warm the thumbnail cache before a benchmark",
        "Cold thumbnail caches make the first benchmark run slow.",
    ),
    "useful-b": Spec(
        "Warm the thumbnail cache before a profile",
        "Cold thumbnail caches make the first profile run slow.",
    ),
    # Two lessons about as relevant to "keystore" (one a little longer, so
    # ranked a little lower where length counts): usefulness orders them.
    "near-a": Spec(
        "Rotate the keystore password yearly",
        "A keystore password expires: rotate it.",
    ),
    "near-b": Spec(
        "Rotate the keystore password yearly",
        "A keystore password expires: rotate it soon.",
    ),
    # Corrected from protobuf to flatbuffers.
    "corrected": Spec(
        "Pin the protobuf compiler version",
        "Builds break when protobuf releases a new compiler: pin it in the toolchain file.",
        kind="gotcha",
    ),
    # Superseded: the vault script by the keyring service.
    "superseded": Spec(
        "Rotate signing keys with the vault script",
        "Run the vault script to rotate the signing keys every quarter.",
        kind="how-to",
    ),
    "replacement": Spec(
        "Rotate signing keys with the keyring service",
        "The keyring service rotates the signing keys every quarter on its own.",
        kind="how-to",
    ),
    # A long text whose one matched word is far from its start.
    "snippet": Spec(
        "Notes from the outage review",
        "The outage began on a Tuesday afternoon when the primary database ran out of "
        "disk space and every writer stalled. The team spent an hour on the wrong "
        "theory before the storage graphs were read. Once the disk was grown, writes "
        "resumed, but the quarantine flag on the replicated tables had to be cleared "
        "by hand before readers saw fresh rows again. Write the runbook down.",
        project="web",
    ),
    # Filters: every one says "kerberos".
    "f-main-code": Spec(
        "Kerberos tickets expire during long builds",
        "Renew the kerberos ticket in the build step.",
        project="main",
        kind="gotcha",
        task_kinds=("code",),
        tags=("auth",),
        paths=("src/auth/**",),
    ),
    "f-web-review": Spec(
        "Review kerberos changes with the platform team",
        "Any change to the kerberos realm needs a platform reviewer.",
        project="web",
        kind="convention",
        task_kinds=("review",),
        tags=("docs",),
        paths=("docs/*.md",),
    ),
    "f-common-howto": Spec(
        "How to get a kerberos ticket on a runner",
        "Use the keytab the runner mounts; kinit with it before the job.",
        project=None,
        kind="how-to",
        tags=("auth", "ops"),
    ),
    "f-common-decision": Spec(
        "Kerberos stays for the deploy gateway",
        "We keep kerberos at the deploy gateway until the identity provider is ready.",
        project=None,
        kind="decision",
        task_kinds=("integration",),
        paths=("deploy/**",),
    ),
    "f-main-note": Spec(
        "The kerberos realm is case sensitive",
        "Write the realm in capitals in every kerberos config.",
        project="main",
        kind="note",
        task_kinds=("general", "code"),
        tags=("ops",),
    ),
}


@dataclass
class Corpus:
    """A lab whose space holds the generated bulk and the needles."""

    lab: Lab
    needles: dict[str, str] = field(default_factory=dict)
    bulk: dict[str, Spec] = field(default_factory=dict)

    def names(self, items: Iterable[dict[str, Any]]) -> list[str]:
        """The needle names of ``items`` (the id of any other lesson)."""
        names = {ident: name for name, ident in self.needles.items()}
        return [names.get(item["id"], item["id"]) for item in items]

    async def find(self, **query: Any) -> list[dict[str, Any]]:
        """Every item of a search or list (as the viewer, following the cursor)."""
        items: list[dict[str, Any]] = await self.lab.search(self.lab.viewer, **query)
        return items

    async def found(self, **query: Any) -> list[str]:
        """The needle names (or ids) a search or list finds, in order."""
        return self.names(await self.find(**query))


async def build_corpus(lab: Lab) -> Corpus:
    """The generated bulk, then the needles, published by an agent."""
    corpus = Corpus(lab)
    projects = {
        name: (await lab.call("GET", f"/projects/{name}", expect=200))["id"]
        for name in PROJECTS
        if name is not None
    }
    actor = Actor(principal_id=lab.agent.id, kind="agent", name=lab.agent.name)
    bulk = generated()
    for start in range(0, len(bulk), 250):
        async with lab.app.db.write() as tx:
            for spec in bulk[start : start + 250]:
                made = await lessons.create(
                    lab.app,
                    tx,
                    actor,
                    (lab.space.pk, lab.space.id),
                    projects[spec.project] if spec.project else None,
                    LessonIn().load(spec.body()),
                )
                corpus.bulk[made] = spec
    for name, spec in NEEDLES.items():
        made = await lab.call("POST", "/lessons", lab.agent, json=spec.body(), expect=201)
        corpus.needles[name] = made["id"]
    return corpus


#: Words only needles say (the bulk never does), so that a search for them
#: finds exactly the needles expected.
NEEDLE_WORDS = {
    "retrying",
    "database",
    "backoff",
    "migrations",
    "migrating",
    "deploy",
    "tombstone",
    "thumbnail",
    "protobuf",
    "flatbuffers",
    "toolchain",
    "signing",
    "keys",
    "vault",
    "keyring",
    "quarantine",
    "kerberos",
}


@pytest.mark.engine_independent
def test_the_generated_bulk_is_varied_and_says_no_needle_word() -> None:
    """The same bulk from the same seed: over every project, kind, task
    kind and tag, with none of the needles' own words and never the phrase
    "lock timeout" (its words apart are common)."""
    bulk = generated()
    assert bulk == generated() and len(bulk) == BULK
    assert {spec.project for spec in bulk} == set(PROJECTS)
    assert {spec.kind for spec in bulk} == set(KINDS)
    assert {kind for spec in bulk for kind in spec.task_kinds} == set(TASK_KINDS)
    assert {tag for spec in bulk for tag in spec.tags} == set(TAGS)
    assert not NEEDLE_WORDS & {word for spec in bulk for word in spec.words()}
    pairs = {pair for spec in bulk for pair in pairwise(re.findall(r"[a-z]+", spec.text.lower()))}
    assert ("lock", "timeout") not in pairs
    assert any(("lock" in s.words() and "timeout" in s.words()) for s in bulk)


def matching(corpus: Corpus, *patterns: str) -> set[str]:
    """The ids of the corpus's lessons whose title or text matches every
    regular expression of ``patterns`` (case-insensitive)."""
    every = {**corpus.bulk, **{corpus.needles[n]: spec for n, spec in NEEDLES.items()}}
    return {
        ident
        for ident, spec in every.items()
        if all(re.search(p, spec.title + " " + spec.text, re.I) for p in patterns)
    }


def marked(item: dict[str, Any]) -> list[str]:
    """The words a hit's snippet marks as matched, lowercased."""
    return [w.lower() for m in MARKED.findall(item["match"]["snippet"]) for w in m.split()]


async def test_every_lesson_is_listed_and_found_once_and_no_other_spaces(
    lab: Lab, make_space: Callable[..., Awaitable[SpaceHandle]]
) -> None:
    """The corpus is listed whole, newest first, over both projects, the
    common collection and every kind; a search over many pages finds every
    lesson holding its word once, in rank order; another space's lessons
    are neither listed nor found. Caught on purpose: the filters without
    their space condition (the list shows the other space's lessons), a
    cursor one short (hits twice), relevance steps dropped (order)."""
    other = await make_space(lab.owner)
    elsewhere = [
        await lab.call("POST", f"/v1/spaces/{other.id}/lessons", json=spec.body(), expect=201)
        for spec in (
            Spec(NEEDLES["f-common-howto"].title, NEEDLES["f-common-howto"].text, project=None),
            Spec(NEEDLES["retrying"].title, NEEDLES["retrying"].text, project=None),
            Spec("A replica of the replica", "Every replica lags.", project=None),
        )
    ]
    corpus = await build_corpus(lab)
    await check_listing(corpus)
    await check_paging(corpus)
    strangers = {made["id"] for made in elsewhere}
    for query in ({}, {"q": "kerberos"}, {"q": "retry flaky connection"}, {"q": "replica"}):
        assert not strangers & {item["id"] for item in await corpus.find(limit=200, **query)}


async def check_listing(corpus: Corpus) -> None:
    """Without a query: every lesson once, newest first; a filter keeps
    exactly the generated lessons it admits."""
    listed = await corpus.find(limit=200)
    assert len(listed) == BULK + len(NEEDLES) >= 1_000
    assert [item["id"] for item in listed] == list(
        reversed([*corpus.bulk, *corpus.needles.values()])
    )
    assert {item["collection"] for item in listed} == {"project", "common"}
    assert {item["kind"] for item in listed} == set(KINDS)
    assert len({item["project_id"] for item in listed}) == 3
    assert await corpus.found(project="web", kind="decision", common="exclude", limit=200) == [
        ident
        for ident, spec in reversed(corpus.bulk.items())
        if (spec.project, spec.kind) == ("web", "decision")
    ]


async def check_paging(corpus: Corpus) -> None:
    """A search over many pages (the cursor holds the offset) gives every
    lesson holding the word once, ranked the same whatever the page size:
    relevance in steps of 1/20 of the best, then usefulness."""
    pages: list[list[dict[str, Any]]] = []
    params = {"q": "replica", "limit": "23"}
    while True:
        page = await corpus.lab.call(
            "GET", "/lessons?" + urlencode(params), corpus.lab.viewer, expect=200
        )
        pages.append(page["items"])
        if not page["next_cursor"]:
            break
        params["cursor"] = page["next_cursor"]
    hits = [item for page in pages for item in page]
    assert len(pages) > 5 and all(len(page) == 23 for page in pages[:-1])
    ids = [h["id"] for h in hits]
    assert len(ids) == len(set(ids))
    assert set(ids) == matching(corpus, r"\breplicas?\b")
    assert ids == [h["id"] for h in await corpus.find(q="replica", limit=200)]
    ranks = [(round(h["match"]["relevance"] * 20), h["usefulness"]["score"]) for h in hits]
    assert ranks == sorted(ranks, reverse=True)
    assert max(h["match"]["relevance"] for h in hits) == 1.0


async def test_stemmed_and_phrase_queries_and_titles_rank_the_expected_lesson_first(
    lab: Lab,
) -> None:
    """Stemmed words find every form of them, the needle first; a phrase
    finds its words together only; a title match comes before a text-only
    one; each hit's snippet marks what matched. Caught on purpose:
    relevance steps dropped (the decoy first), a cursor one short."""
    corpus = await build_corpus(lab)
    await check_stemmed(corpus)
    await check_phrase(corpus)
    await check_title_over_text(corpus)
    await check_snippets(corpus)


async def check_stemmed(corpus: Corpus) -> None:
    """``retry flaky connection`` finds "Retrying flaky connections" first,
    then every other lesson holding a form of each word (and only those):
    the lesson that says them apart in its text, and the generated ones."""
    hits = await corpus.find(q="retry flaky connection")
    names = corpus.names(hits)
    assert names[0] == "retrying"
    assert "retry-decoy" in names
    assert len(names) == len(set(names))
    assert {h["id"] for h in hits} == matching(
        corpus, r"\bretr(y|ies|ying)\b", r"\bflaky\b", r"\bconnections?\b"
    )
    assert len(hits) > 20
    assert await corpus.found(q="migrating deploys") == ["migrating"]
    assert await corpus.found(q="MIGRATION Deployed") == ["migrating"]


async def check_phrase(corpus: Corpus) -> None:
    """``"lock timeout"`` finds the lesson saying it in its title and text,
    then the one saying it in its text; not the one, nor any generated
    lesson, that has both words apart (which the same words unquoted find)."""
    assert await corpus.found(q='"lock timeout"') == ["phrase-title", "phrase-text"]
    assert await corpus.found(q='"Lock  Timeout" sweeper') == []
    apart = await corpus.found(q="lock timeout")
    assert {"phrase-title", "phrase-text", "phrase-apart"} <= set(apart)
    assert len(apart) > 10


async def check_title_over_text(corpus: Corpus) -> None:
    """A word in a lesson's title outranks the same word in another's text,
    even when that other is voted more useful: relevance comes first."""
    lab, text_hit = corpus.lab, corpus.needles["text-hit"]
    for who in (lab.agent2, lab.owner):
        await lab.call(
            "POST", f"/lessons/{text_hit}/votes", who, json={"vote": "helpful"}, expect=200
        )
    hits = await corpus.find(q="tombstone")
    assert corpus.names(hits) == ["title-hit", "text-hit"]
    assert [h["usefulness"]["score"] for h in hits] == [0, 2]
    assert hits[0]["match"]["relevance"] == 1.0 > hits[1]["match"]["relevance"]


async def check_snippets(corpus: Corpus) -> None:
    """A hit's snippet is a piece of its title and text around the match,
    each matched word between U+0002 and U+0003 and nothing else marked."""
    (hit,) = await corpus.find(q="quarantine")
    snippet = hit["match"]["snippet"]
    assert "\x02quarantine\x03" in snippet
    assert len(snippet) < len(hit["text"]) / 2
    plain = " ".join(snippet.replace("\x02", "").replace("\x03", "").strip("…").split())
    assert plain in " ".join((hit["title"] + " " + hit["text"]).split())
    first = (await corpus.find(q="retry flaky connection"))[0]
    assert set(marked(first)) <= {"retrying", "flaky", "connections"}
    assert {"flaky", "connections"} <= set(marked(first))
    for phrase in await corpus.find(q='"lock timeout"'):
        assert set(marked(phrase)) == {"lock", "timeout"}


#: Which filter needles each filter of a "kerberos" search keeps.
FILTERED: list[tuple[dict[str, str], set[str]]] = [
    ({}, {"f-main-code", "f-web-review", "f-common-howto", "f-common-decision", "f-main-note"}),
    ({"project": "main"}, {"f-main-code", "f-main-note", "f-common-howto", "f-common-decision"}),
    ({"project": "web", "common": "exclude"}, {"f-web-review"}),
    ({"project": "main", "common": "exclude"}, {"f-main-code", "f-main-note"}),
    ({"common": "only"}, {"f-common-howto", "f-common-decision"}),
    ({"common": "exclude"}, {"f-main-code", "f-web-review", "f-main-note"}),
    ({"kind": "gotcha"}, {"f-main-code"}),
    ({"kind": "decision", "common": "only"}, {"f-common-decision"}),
    ({"kind": "decision", "common": "exclude"}, set()),
    ({"task_kind": "code"}, {"f-main-code", "f-main-note", "f-common-howto"}),
    ({"task_kind": "review"}, {"f-web-review", "f-common-howto"}),
    ({"task_kind": "integration", "project": "web"}, {"f-common-decision", "f-common-howto"}),
    ({"tag": "auth"}, {"f-main-code", "f-common-howto"}),
    ({"tag": "ops", "common": "exclude"}, {"f-main-note"}),
    ({"tag": "Auth"}, set()),
    ({"path": "src/auth/login.py"}, {"f-main-code", "f-common-howto", "f-main-note"}),
    ({"path": "docs/setup.md"}, {"f-web-review", "f-common-howto", "f-main-note"}),
    (
        {"path": "deploy/prod/gateway.yaml", "common": "only"},
        {"f-common-howto", "f-common-decision"},
    ),
    (
        {"project": "main", "task_kind": "code", "tag": "auth", "path": "src/auth/x.py"},
        {"f-main-code", "f-common-howto"},
    ),
]


async def test_filters_keep_exactly_the_expected_needles(lab: Lab) -> None:
    """Project, common collection, kind, task kind (a lesson for any task
    kind applies to each), tag (case-sensitive) and path (a lesson's globs;
    none: any path) keep exactly the lessons they admit, alone and together.
    Caught on purpose: the path filter, ``common=only`` or the task kind's
    "any" dropped."""
    corpus = await build_corpus(lab)
    for filters, expected in FILTERED:
        found = await corpus.found(q="kerberos", **filters)
        assert len(found) == len(set(found))
        assert set(found) == expected, filters
    await lab.call("GET", "/lessons?q=kerberos&project=nope", lab.viewer, problem="not-found")
    await lab.call("GET", "/lessons?q=kerberos&common=some", lab.viewer, problem="validation-error")


async def test_votes_corrections_and_supersession_show_in_the_ranking(lab: Lab) -> None:
    """Usefulness, then recency, orders lessons as relevant; a corrected
    lesson is found by its latest revision; a superseded one is hidden by
    default and reachable by its link. Caught on purpose: the usefulness or
    the recency tie-break dropped, relevance compared unstepped, the
    superseded condition dropped, a correction that leaves the index as it
    was."""
    corpus = await build_corpus(lab)
    await check_usefulness_then_recency(corpus)
    await check_usefulness_within_a_step(corpus)
    await check_correction(corpus)
    await check_supersession(corpus)


async def check_usefulness_then_recency(corpus: Corpus) -> None:
    """Two lessons as relevant: the newer first, until a vote makes the
    other more useful; a wrong vote sends it back; a correction (votes start
    afresh) makes it the more recently changed, which comes first again."""
    lab = corpus.lab
    a = corpus.needles["useful-a"]

    async def order() -> list[str]:
        hits = await corpus.find(q="thumbnail")
        assert hits[0]["match"]["relevance"] == hits[1]["match"]["relevance"] == 1.0
        return corpus.names(hits)

    assert await order() == ["useful-b", "useful-a"]
    await lab.call("POST", f"/lessons/{a}/votes", lab.agent2, json={"vote": "helpful"}, expect=200)
    assert await order() == ["useful-a", "useful-b"]
    await lab.call("POST", f"/lessons/{a}/votes", lab.agent2, json={"vote": "wrong"}, expect=200)
    assert await order() == ["useful-b", "useful-a"]
    lab.app.clock.advance(seconds=60)
    fixed = await lab.call(
        "POST",
        f"/lessons/{a}/revisions",
        lab.agent2,
        json={"revision": 1, "reason": "it is a convention", "kind": "convention"},
        expect=201,
    )
    assert fixed["usefulness"]["score"] == 0
    assert await order() == ["useful-a", "useful-b"]


async def check_usefulness_within_a_step(corpus: Corpus) -> None:
    """Relevance counts in steps of 1/20 of the best: a lesson a little less
    relevant but more useful comes first."""
    lab = corpus.lab
    await lab.call(
        "POST",
        f"/lessons/{corpus.needles['near-b']}/votes",
        lab.agent2,
        json={"vote": "helpful"},
        expect=200,
    )
    hits = await corpus.find(q="keystore")
    assert corpus.names(hits) == ["near-b", "near-a"]
    assert [round(h["match"]["relevance"] * 20) for h in hits] == [20, 20]


async def check_correction(corpus: Corpus) -> None:
    """After a correction, the lesson is found by its new words, not its
    old ones, once, and its hit shows the latest revision."""
    lab, ident = corpus.lab, corpus.needles["corrected"]
    assert await corpus.found(q="protobuf") == ["corrected"]
    title = "Pin the flatbuffers compiler version"
    text = "Builds break when flatbuffers releases a new compiler: pin it in the toolchain file."
    await lab.call(
        "POST",
        f"/lessons/{ident}/revisions",
        lab.agent2,
        json={"revision": 1, "reason": "we moved to flatbuffers", "title": title, "text": text},
        expect=201,
    )
    assert await corpus.find(q="protobuf") == []
    (hit,) = await corpus.find(q="flatbuffers")
    assert hit["id"] == ident
    assert (hit["revision"], hit["title"], hit["text"]) == (2, title, text)
    assert hit["correction_reason"] == "we moved to flatbuffers"
    assert set(marked(hit)) == {"flatbuffers"}
    assert await corpus.found(q='"toolchain file" compiler') == ["corrected"]


async def check_supersession(corpus: Corpus) -> None:
    """Once superseded, a lesson leaves default searches and lists; it is
    found with ``superseded=include`` or ``only``, and its id shows it with
    ``superseded_by``."""
    lab = corpus.lab
    old, new = corpus.needles["superseded"], corpus.needles["replacement"]
    assert set(await corpus.found(q="signing keys")) == {"superseded", "replacement"}
    await lab.call(
        "POST", f"/lessons/{old}/supersede", json={"by": new, "reason": "moved"}, expect=200
    )
    assert await corpus.found(q="signing keys") == ["replacement"]
    assert await corpus.found(q="vault") == []
    included = await corpus.found(q="signing keys", superseded="include", kind="how-to")
    assert set(included) == {"superseded", "replacement"}
    assert await corpus.found(q="signing keys", superseded="only") == ["superseded"]
    assert await corpus.found(q="vault", superseded="include") == ["superseded"]
    assert old not in {item["id"] for item in await corpus.find(limit=200)}
    assert await corpus.found(superseded="only") == ["superseded"]
    shown = await lab.call("GET", f"/lessons/{old}", lab.viewer, expect=200)
    assert (shown["superseded_by"], shown["superseded_reason"]) == (new, "moved")
    replacement = await lab.call("GET", f"/lessons/{new}", lab.viewer, expect=200)
    assert (replacement["supersedes"], replacement["superseded_by"]) == ([old], None)
