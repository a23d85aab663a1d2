"""A scripted reviewer: claim review work in a space, decide, repeat.

One command, against a local server, as a principal that is a member of the
space (an agent or a human, not the author of the work under review)::

    python examples/reviewer_loop.py --url http://127.0.0.1:8420 --token $TOKEN \
        --space myspace --until-empty

Each round claims the next review work item the server offers this reviewer
(``POST /v1/spaces/{space}/claims`` with ``kind = "review"``: the server
passes over work the reviewer may not take, such as its own submissions or
a second slot of a submission it already reviews), then records the review
on it (``POST /v1/spaces/{space}/reviews/{task}``): an approval, or with
``--reject-all`` a request for changes with one finding. ``--once`` stops
after one item; ``--until-empty`` (the default) stops when no review work is
left for this reviewer.

A review the server refuses (the criteria changed since the submission, the
reviewer is not independent, ...) gives the work item back to the queue and
stops the loop.

Exit status:

- 0: every claimed work item was reviewed (possibly none: nothing to do);
- 1: the server refused a review; the work item was given back;
- 2: the command line is wrong (``--help`` says how to call it);
- 3: the server could not be reached, or refused the reviewer itself
  (unknown token, not a member of the space, no such space).

``--url`` and ``--token`` default to ``BUILDMAX_URL`` and ``BUILDMAX_TOKEN``
(then to the login file of ``buildmax login``), ``--space`` to
``BUILDMAX_SPACE``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from buildmax_reviews.client import ReviewsClient, finding
from buildmax_tasks.client import TasksClient

from buildmax.client import BuildMaxError, Client, Unreachable

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3

#: The finding a ``--reject-all`` request for changes carries.
REJECT_FINDING = "changes requested by the scripted reviewer (--reject-all)"


class ReviewRefused(Exception):
    """The server refused a review on a claimed work item (given back since)."""

    def __init__(self, work_id: str, error: BuildMaxError) -> None:
        self.work_id = work_id
        self.error = error
        super().__init__(f"the review of {work_id} was refused: {error}")


@dataclass
class Tally:
    """What the loop did."""

    approved: list[str] = field(default_factory=list)
    changes_requested: list[str] = field(default_factory=list)
    skipped: int = 0

    @property
    def reviewed(self) -> int:
        return len(self.approved) + len(self.changes_requested)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (argparse exits with status 2 on a mistake)."""
    parser = argparse.ArgumentParser(
        prog="reviewer_loop.py",
        description=(
            "Claim the review work of a BuildMax space one item at a time and record a "
            "review on each: approve it, or with --reject-all ask for changes. "
            "Exit status: 0 all claimed work reviewed (or none to do), 1 a review was "
            "refused (its work item given back), 2 usage error, 3 server unreachable or "
            "the reviewer refused (token, membership, space)."
        ),
        epilog=(
            "example: python examples/reviewer_loop.py --url http://127.0.0.1:8420 "
            "--token $TOKEN --space myspace --until-empty"
        ),
    )
    parser.add_argument(
        "--url", help="the server's base URL (default: $BUILDMAX_URL, then the login file)"
    )
    parser.add_argument(
        "--token",
        help="the reviewer's API token (default: $BUILDMAX_TOKEN, then the login file)",
    )
    parser.add_argument(
        "--space",
        default=os.environ.get("BUILDMAX_SPACE"),
        help="the space's slug or id (default: $BUILDMAX_SPACE)",
    )
    parser.add_argument("--project", help="only review work of this project (name or id)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="review at most one work item, then stop")
    mode.add_argument(
        "--until-empty",
        action="store_true",
        help="keep going until no review work is left for this reviewer (the default)",
    )
    parser.add_argument(
        "--reject-all",
        action="store_true",
        help="request changes (with one finding) instead of approving",
    )
    parser.add_argument(
        "--summary",
        default="approved by the scripted reviewer",
        help="the summary recorded with each approval",
    )
    parser.add_argument(
        "--max",
        type=int,
        default=1000,
        metavar="N",
        help="stop after N reviews even if work is left (default: 1000)",
    )
    parser.add_argument(
        "--lease-seconds",
        type=int,
        metavar="S",
        help="the lease asked for each claim (default: the server's)",
    )
    args = parser.parse_args(argv)
    if not args.space:
        parser.error("--space is required (or set BUILDMAX_SPACE)")
    if args.max < 1:
        parser.error("--max must be at least 1")
    return args


def review_one(
    tasks: TasksClient, reviews: ReviewsClient, args: argparse.Namespace, tally: Tally
) -> bool:
    """Claim the next review work item and record a review on it. ``False``
    when there was nothing to claim. A refused review raises
    :class:`ReviewRefused` once the work item was given back."""
    claim: dict[str, Any] = tasks.claim_next(
        args.space, project=args.project, kind="review", lease_seconds=args.lease_seconds
    )
    tally.skipped = max(tally.skipped, int(claim.get("skipped") or 0))
    task = claim.get("task")
    if task is None:
        return False
    attempt = claim["attempt"]
    work_id = str(task["id"])
    try:
        if args.reject_all:
            recorded = reviews.request_changes(
                args.space,
                work_id,
                [finding("major", REJECT_FINDING)],
                summary="changes requested",
                generation=attempt["generation"],
            )
        else:
            recorded = reviews.approve(
                args.space, work_id, summary=args.summary, generation=attempt["generation"]
            )
    except BuildMaxError as refused:
        # Give the item back so another reviewer can take it, then report.
        try:
            tasks.release(
                args.space,
                attempt["id"],
                attempt["generation"],
                reason="the scripted reviewer's review was refused",
            )
        except BuildMaxError as exc:
            print(f"could not give {work_id} back: {exc}", file=sys.stderr)
        raise ReviewRefused(work_id, refused) from refused
    review = recorded.get("review") or {}
    decision = review.get("decision", "?")
    (tally.changes_requested if args.reject_all else tally.approved).append(work_id)
    print(
        f"{decision}: {work_id} (subject {recorded.get('subject_id')}, review {review.get('id')})",
        flush=True,
    )
    return True


def run(args: argparse.Namespace) -> int:
    """The loop; its exit status."""
    tally = Tally()
    try:
        with Client(args.url, args.token) as client:
            tasks = TasksClient(client)
            reviews = ReviewsClient(client)
            limit = 1 if args.once else args.max
            while tally.reviewed < limit and review_one(tasks, reviews, args, tally):
                pass
    except ReviewRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        print(_summary(tally), file=sys.stderr)
        return EXIT_REFUSED
    except (Unreachable, BuildMaxError) as exc:
        # No claim: the server is away, or refuses this reviewer or space.
        print(f"error: {exc}", file=sys.stderr)
        print(_summary(tally), file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(_summary(tally), flush=True)
    return EXIT_OK


def _summary(tally: Tally) -> str:
    return (
        f"reviewed {tally.reviewed}: {len(tally.approved)} approved, "
        f"{len(tally.changes_requested)} with changes requested"
        + (f"; {tally.skipped} item(s) passed over" if tally.skipped else "")
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
