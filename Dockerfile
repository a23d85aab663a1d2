# BuildMax server image: the kernel and every first-party plugin (the install
# of requirements-server.txt), run as the unprivileged user `buildmax`.
#
# Build, from the root of a checkout of the repository:
#
#   docker build -t buildmax:0.1.0 .
#
# Run on SQLite (the embedded default): the database and the blobs live in
# the volume mounted at /var/lib/buildmax (a host folder mounted there must
# be owned by uid 10001, the server's user).
#
#   docker run -d --name buildmax -p 8420:8420 -v buildmax-data:/var/lib/buildmax buildmax:0.1.0
#
# The first start creates the first admin and prints its API token (once)
# to the container's log (`docker logs buildmax`), where it stays. To keep it
# out of the log, create the admin before the first start; the token is
# printed to your terminal instead:
#
#   docker run --rm -v buildmax-data:/var/lib/buildmax buildmax:0.1.0 admin bootstrap
#
# Run on PostgreSQL (and several server processes): pass the database URL,
# create the schema with a one-off container, then start the server. A
# server on PostgreSQL refuses to start while migrations are pending: run
# the same one-off `db migrate` after every upgrade of the image.
#
#   docker run --rm -e BUILDMAX_DATABASE_URL=postgresql://buildmax:secret@db:5432/buildmax buildmax:0.1.0 db migrate
#   docker run --rm -e BUILDMAX_DATABASE_URL=postgresql://buildmax:secret@db:5432/buildmax buildmax:0.1.0 admin bootstrap
#   docker run -d --name buildmax -p 8420:8420 -v buildmax-data:/var/lib/buildmax -e BUILDMAX_DATABASE_URL=postgresql://buildmax:secret@db:5432/buildmax -e BUILDMAX_WORKERS=4 buildmax:0.1.0
#
# (`buildmax:0.1.0 serve --workers 4` says the same as BUILDMAX_WORKERS=4.)
# The blobs stay in the data volume unless BUILDMAX_BLOB_STORE_URL says
# otherwise. Several containers on one database must share the blob store:
# a volume mounted at the same path in each, named by BUILDMAX_BLOB_STORE_URL
# (file:///<path>), or an s3:// bucket. Every setting is a BUILDMAX_<SETTING>
# variable (docs/configuration.md), or a TOML file mounted into the container
# and named by BUILDMAX_CONFIG.
#
# Backups go to /var/backups/buildmax (BUILDMAX_BACKUP_DIR), owned by the
# server's user: mount a volume there, `-v buildmax-backups:/var/backups/buildmax`
# (or a host folder owned by uid 10001), and take one while the server runs:
#
#   docker exec buildmax buildmax backup create --keep 7
#
# pg_dump and pg_restore of PostgreSQL 17 are in the image for backups of a
# PostgreSQL database.
#
# Stopping: `docker stop` sends SIGTERM to the server, which is PID 1. It
# drains (/readyz answers 503, requests in flight get shutdown_grace_seconds,
# 10 by default, to finish) and exits. Give `docker stop` more time than that,
# since its own default of 10 s would kill the server mid-drain:
#
#   docker stop -t 30 buildmax
#
# (Raise -t together with BUILDMAX_SHUTDOWN_GRACE_SECONDS.)
#
# The health check asks /livez on 127.0.0.1 at the port of the server's
# settings (BUILDMAX_PORT or the file of BUILDMAX_CONFIG; 8420 by default):
# keep BUILDMAX_HOST a wildcard address (0.0.0.0, the default here) or a
# loopback one. Load balancers should use /readyz instead.
#
# Another plugin: a derived image, `FROM buildmax:0.1.0`, then `USER root`,
# `RUN pip install --no-cache-dir <plugin>` (the venv's pip) and
# `USER 10001:10001` again.

FROM python:3.11-slim-trixie AS builder

# The venv first on the PATH: once it exists, `pip` is the venv's.
ENV PATH="/opt/buildmax/venv/bin:$PATH" \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /opt/buildmax/venv

WORKDIR /src

# Only what `pip install -r requirements-server.txt` reads: each path listed
# in it, with the files its pyproject.toml names (the root project's README).
COPY requirements-server.txt pyproject.toml README.md ./
COPY buildmax/ buildmax/
COPY hookspecs/ hookspecs/
COPY plugins/tasks/ plugins/tasks/
COPY plugins/audit/ plugins/audit/
COPY plugins/artifacts/ plugins/artifacts/
COPY plugins/s3/ plugins/s3/
COPY plugins/reviews/ plugins/reviews/
COPY plugins/marketplace/ plugins/marketplace/
COPY plugins/graders/ plugins/graders/
COPY plugins/mcp/ plugins/mcp/
COPY plugins/dashboard/ plugins/dashboard/
COPY plugins/lessons/ plugins/lessons/
COPY plugins/imports/ plugins/imports/

RUN pip install --no-cache-dir -r requirements-server.txt


FROM python:3.11-slim-trixie

LABEL org.opencontainers.image.title="buildmax" \
      org.opencontainers.image.description="A self-hosted coordination server for AI coding agents" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"

# pg_dump and pg_restore, for backups and restores of a PostgreSQL database
# (`buildmax backup create`, `buildmax backup restore`). The version is the
# Debian release's (17 in trixie), which its security updates replace: a
# pinned one would go stale.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends postgresql-client \
    && rm -rf /var/lib/apt/lists/*

# A fixed uid/gid (10001), so that volumes and bind mounts can be prepared
# for it; USER below names it by number, which needs no passwd lookup on the
# host (Kubernetes runAsNonRoot checks it).
RUN groupadd --system --gid 10001 buildmax \
    && useradd --system --uid 10001 --gid buildmax --no-create-home \
        --home-dir /var/lib/buildmax --shell /usr/sbin/nologin buildmax \
    && install -d -m 0750 -o buildmax -g buildmax /var/lib/buildmax \
    && install -d -m 0700 -o buildmax -g buildmax /var/backups/buildmax

COPY --from=builder /opt/buildmax/venv /opt/buildmax/venv

ENV PATH="/opt/buildmax/venv/bin:$PATH" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    BUILDMAX_DATA_DIR=/var/lib/buildmax \
    BUILDMAX_HOST=0.0.0.0 \
    BUILDMAX_BACKUP_DIR=/var/backups/buildmax

VOLUME ["/var/lib/buildmax"]
EXPOSE 8420

USER 10001:10001
WORKDIR /var/lib/buildmax

HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/opt/buildmax/venv/bin/python", "-c", "from urllib.request import urlopen; from buildmax.config import load_config; urlopen(f'http://127.0.0.1:{load_config().port}/livez', timeout=4)"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["buildmax"]
CMD ["serve"]
