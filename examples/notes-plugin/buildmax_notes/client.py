"""Typed calls for the notes routes, on top of the kernel's client."""

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

from buildmax.client import Client


class NotesClient:
    """The notes routes of one server."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def add_note(self, space: str, text: str) -> dict[str, Any]:
        """Add a note; retried safely, with the same idempotency key."""
        return self._client.request(
            "POST", f"/v1/spaces/{quote(space, safe='')}/notes", json={"text": text}
        )

    def notes(self, space: str) -> Iterator[dict[str, Any]]:
        """Every note of a space, newest first, page after page."""
        return self._client.paginate(f"/v1/spaces/{quote(space, safe='')}/notes")
