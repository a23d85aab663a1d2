"""The ceiling for ``bench_artifacts.py``: the same server stack (Hypercorn
with uvloop) and the least work that stores an upload durably, with no
framework, authentication or database.

Every ``POST`` body is hashed with sha256 and written to a new file in
``DIR`` as it arrives, fsynced, renamed to its digest, and answered 201;
``GET /livez`` answers 200. Run by the benchmark:

    python benchmarks/bare_upload.py PORT DIR
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
from typing import Any

import uvloop
from hypercorn.asyncio import serve
from hypercorn.config import Config


def make_app(directory: str) -> Any:
    """An ASGI app storing each POST body in ``directory``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                done = message["type"].replace(".startup", ".startup.complete")
                done = done.replace(".shutdown", ".shutdown.complete")
                await send({"type": done})
                if message["type"] == "lifespan.shutdown":
                    return
        status = 200
        if scope["method"] == "POST":
            digest = hashlib.sha256()
            temporary = os.path.join(directory, secrets.token_hex(8))
            with open(temporary, "xb") as fh:  # noqa: ASYNC230 - inline: the least work
                more = True
                while more:
                    message = await receive()
                    chunk = message.get("body", b"")
                    digest.update(chunk)
                    fh.write(chunk)
                    more = message.get("more_body", False)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(temporary, os.path.join(directory, digest.hexdigest()))
            status = 201
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


def main() -> None:
    port, directory = sys.argv[1], sys.argv[2]
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    uvloop.run(serve(make_app(directory), config))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
