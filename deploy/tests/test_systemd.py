"""The systemd units of deploy/systemd and the README steps that install them.

Fast (the lint env): ``systemd-analyze verify`` passes the three units and
fails copies with a deliberate mistake, ``systemd-analyze calendar`` parses
the timer's ``OnCalendar=``, ``systemd-sysusers --dry-run`` parses the user
file, and the units agree with the README and with the server's defaults.
``verify`` runs offline, against a temporary root (``--root=``) holding this
machine's own system units and a stub at each unit's ``ExecStart=`` path.

Slow (``rehearsal``, the deploy env): the README's "Install on one machine
(SQLite)" steps, and its "PostgreSQL and several workers" steps, in a fresh
virtual environment, then each installed unit's ``ExecStart=`` as written.
Nothing is installed on this machine: the paths the steps name
(``MACHINE_PATHS``) are moved under a temporary root, in the commands, in
the configuration files they install and in the units; the steps run as the
current user instead of ``buildmax`` (no user is added); the commands that
need a running systemd (``systemctl``, and ``curl`` of the started service)
are left out, and ``systemd-sysusers`` runs with ``--dry-run`` on the root.
``pip install`` runs as ``uv pip install`` of the same requirement file, for
speed, when uv is there.
"""

from __future__ import annotations

import dataclasses
import grp
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from buildmax.config import Config, load_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
UNITS = DEPLOY / "systemd"
README = DEPLOY / "README.md"
SERVER = "buildmax.service"
BACKUP = "buildmax-backup.service"
TIMER = "buildmax-backup.timer"
UNIT_FILES = (SERVER, BACKUP, TIMER)
INSTALL = "Install on one machine (SQLite)"
UPGRADING = "### Upgrading"
POSTGRES = "PostgreSQL and several workers"
#: The README's example database URL, which the PostgreSQL rehearsal replaces.
EXAMPLE_DATABASE_URL = "postgresql://buildmax:secret@db.internal:5432/buildmax"
PG_SERVER = os.environ.get(
    "BUILDMAX_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
#: The machine's paths the README's steps and the units name.
MACHINE_PATHS = (
    "/opt/buildmax",
    "/etc/buildmax",
    "/var/lib/buildmax",
    "/var/backups/buildmax",
    "/etc/sysusers.d",
    "/etc/systemd/system",
)
#: A machine path where it starts a path of its own (not inside another).
MACHINE_PATH = re.compile(
    r"(?<![\w./-])(" + "|".join(re.escape(p) for p in MACHINE_PATHS) + r")(?![\w.-])"
)
#: Commands that need a running systemd or the started service.
NEEDS_SYSTEMD = ("systemctl", "journalctl", "curl")
#: What systemd gives a service before its Environment= lines.
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(autouse=True)
def systemd_tools() -> None:
    """The systemd tools the checks run: missing, they fail (never skip)."""
    missing = [tool for tool in ("systemd-analyze", "systemd-sysusers") if not shutil.which(tool)]
    assert not missing, f"{', '.join(missing)} not installed (Debian: systemd)"


# -- Unit files --------------------------------------------------------------


def unit_entries(text: str) -> list[tuple[str, str, str]]:
    """Each ``Key=value`` of a unit file with its section, in order
    (comments dropped, continued lines joined)."""
    entries = []
    section = ""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith(("#", ";"))):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not a Key=value line: {line!r}"
        entries.append((section, key.strip(), value.strip()))
    return entries


def unit_values(text: str, section: str, key: str) -> list[str]:
    """The values of a (list) setting, as systemd reads them: an empty
    assignment clears the earlier ones."""
    values: list[str] = []
    for s, k, v in unit_entries(text):
        if (s, k) == (section, key):
            values = [*values, v] if v else []
    return values


def unit_value(text: str, section: str, key: str) -> str:
    """The one value of a setting."""
    values = unit_values(text, section, key)
    assert len(values) == 1, f"[{section}] {key}= is set {len(values)} times"
    return values[0]


def unit_text(name: str) -> str:
    return (UNITS / name).read_text()


def replaced(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` (which must be there) replaced: a change to the
    shipped files that this test no longer follows fails it."""
    assert old in text, f"{old!r} is no longer in the shipped file"
    return text.replace(old, new)


def microseconds(timespan: str) -> int:
    """A systemd time span (``30``, ``1min 30s``) as systemd reads it."""
    result = subprocess.run(
        ["systemd-analyze", "timespan", timespan],
        capture_output=True,
        text=True,
        env=systemd_env(),
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    match = re.search(r"^\s*(?:us|μs):\s*(\d+)\s*$", result.stdout, re.M)
    assert match, result.stdout
    return int(match.group(1))


# -- systemd-analyze and systemd-sysusers, offline ---------------------------


def systemd_env() -> dict[str, str]:
    """An environment in which the systemd tools print every warning,
    plainly."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYSTEMD_")}
    env.update(LC_ALL="C", SYSTEMD_LOG_LEVEL="info", SYSTEMD_LOG_COLOR="0", SYSTEMD_PAGER="")
    return env


def host_system_units() -> Path:
    """This machine's packaged unit folder (the one holding sysinit.target)."""
    for folder in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")):
        if (folder / "sysinit.target").exists():
            return folder
    pytest.fail("no packaged systemd units (sysinit.target) on this machine (Debian: systemd)")


def prepare_analysis_root(root: Path) -> Path:
    """``root`` with this machine's system units (the targets every unit
    depends on by default) and an empty /etc/systemd/system."""
    shutil.copytree(host_system_units(), root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True, exist_ok=True)
    return root / "etc/systemd/system"


def stub_executables(root: Path, *unit_texts: str) -> None:
    """An executable at each ``ExecStart=`` path of the units, under ``root``."""
    for text in unit_texts:
        for command in unit_values(text, "Service", "ExecStart"):
            binary = shlex.split(command)[0]
            if not binary.startswith("/"):
                continue  # verify's to complain about
            stub = root / binary.lstrip("/")
            stub.parent.mkdir(parents=True, exist_ok=True)
            stub.write_text("#!/bin/sh\nexit 0\n")
            stub.chmod(0o755)


def verify_problems(root: Path, *names: str) -> list[str]:
    """What ``systemd-analyze verify`` finds wrong with the units ``names``
    of ``root``'s /etc/systemd/system: every line it prints about one of
    them (an unknown key or a bad value is only a warning, exit status 0)
    and its exit status when that is not 0. Empty: nothing wrong."""
    result = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            f"--root={root}",
            "--man=no",
            "--recursive-errors=no",
            *names,
        ],
        capture_output=True,
        text=True,
        env=systemd_env(),
        timeout=60,
    )
    lines = (result.stdout + result.stderr).splitlines()
    problems = [line for line in lines if any(name in line for name in names)]
    if result.returncode != 0:
        problems.append(f"exit status {result.returncode}: {lines}")
    return problems


def calendar_problems(spec: str) -> list[str]:
    """What ``systemd-analyze calendar`` says of an ``OnCalendar=`` value."""
    result = subprocess.run(
        ["systemd-analyze", "calendar", spec],
        capture_output=True,
        text=True,
        env=systemd_env(),
        timeout=30,
    )
    if result.returncode == 0:
        return []
    return [f"exit status {result.returncode}", *result.stderr.splitlines()]


def sysusers_problems(root: Path, path: Path) -> list[str]:
    """What ``systemd-sysusers --dry-run`` says of a sysusers file (with
    ``root`` as the machine, so nothing here is read or changed)."""
    result = subprocess.run(
        ["systemd-sysusers", f"--root={root}", "--dry-run", str(path)],
        capture_output=True,
        text=True,
        env=systemd_env(),
        timeout=30,
    )
    lines = (result.stdout + result.stderr).splitlines()
    problems = [line for line in lines if str(path) in line]
    if result.returncode != 0:
        problems.append(f"exit status {result.returncode}: {lines}")
    return problems


def install_units(folder: Path, **changed: str) -> None:
    """The three units into ``folder``, some of them with other text."""
    for name in UNIT_FILES:
        (folder / name).write_text(changed.get(name, unit_text(name)))


# -- The README ---------------------------------------------------------------


def readme_section(title: str) -> str:
    """The text of the README's ``## title`` section, up to the next one."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def sh_blocks(markdown: str) -> list[str]:
    """The fenced ```sh blocks of ``markdown``, dedented."""
    blocks = re.findall(r"^([ \t]*)```sh\n(.*?)^\1```[ \t]*$", markdown, re.M | re.S)
    return [textwrap.dedent(body) for _indent, body in blocks]


def commands(block: str) -> list[str]:
    """The commands of a shell block: continued lines joined, comments and
    blank lines dropped."""
    found: list[str] = []
    pending = ""
    for raw in block.splitlines():
        line = raw.strip()
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        line, pending = pending + line, ""
        if line and not line.startswith("#"):
            found.append(line)
    return found


def numbered_steps(block: str) -> dict[int, str]:
    """A block cut at its ``# N.`` comments: each step's lines by number."""
    steps: dict[int, str] = {}
    number = 0
    for line in block.splitlines(keepends=True):
        match = re.match(r"#\s*(\d+)\.\s", line)
        if match:
            number = int(match.group(1))
        steps[number] = steps.get(number, "") + line
    return steps


def install_parts() -> tuple[str, str]:
    """The install section's block, and its Upgrading subsection's."""
    section = readme_section(INSTALL)
    assert f"\n{UPGRADING}\n" in section
    before, after = section.split(f"\n{UPGRADING}\n", 1)
    (install,) = sh_blocks(before)
    (upgrade,) = sh_blocks(after)
    return install, upgrade


def readme_venv() -> str:
    """The virtual environment the README installs BuildMax into."""
    install, _upgrade = install_parts()
    (venv,) = re.findall(r"^python3 -m venv (\S+)$", install, re.M)
    return venv


# -- Fast: the units ----------------------------------------------------------


def test_the_units_verify(tmp_path: Path) -> None:
    folder = prepare_analysis_root(tmp_path)
    stub_executables(tmp_path, *(unit_text(n) for n in UNIT_FILES))
    install_units(folder)
    assert verify_problems(tmp_path, *UNIT_FILES) == []


def test_the_timer_calendar_parses() -> None:
    spec = unit_value(unit_text(TIMER), "Timer", "OnCalendar")
    assert calendar_problems(spec) == []
    assert calendar_problems(replaced(spec, "02:30", "25:30")) != []


#: Each a mistake verify must catch: (unit, shipped text, mistaken text).
MISTAKES = {
    "misspelled ExecStart": (SERVER, "\nExecStart=", "\nExecStrat="),
    "relative ExecStart": (
        SERVER,
        "ExecStart=/opt/buildmax/venv/bin/buildmax serve",
        "ExecStart=venv/bin/buildmax serve",
    ),
    # Only warnings, with exit status 0: verify_problems counts them.
    "misspelled setting": (SERVER, "\nTimeoutStopSec=", "\nTimeoutStopSek="),
    "bad value": (BACKUP, "Type=oneshot", "Type=oneshoot"),
    "relative ExecStart of the backup": (
        BACKUP,
        "ExecStart=/opt/buildmax/venv/bin/buildmax",
        "ExecStart=./buildmax",
    ),
    "bad OnCalendar": (TIMER, "OnCalendar=*-*-* 02:30:00", "OnCalendar=*-*-* 25:30:00"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_verify_fails_a_unit_with_a_mistake(tmp_path: Path, mistake: str) -> None:
    name, shipped, mistaken = MISTAKES[mistake]
    folder = prepare_analysis_root(tmp_path)
    stub_executables(tmp_path, *(unit_text(n) for n in UNIT_FILES))
    install_units(folder, **{name: replaced(unit_text(name), shipped, mistaken)})
    problems = verify_problems(tmp_path, name)
    assert problems, f"verify passes {name} with a {mistake}"
    assert all(name in p or p.startswith("exit status") for p in problems)
    # The others still pass (the timer loads the backup service: not it).
    others = [n for n in UNIT_FILES if n != name and not (name == BACKUP and n == TIMER)]
    assert verify_problems(tmp_path, *others) == []


def test_the_sysusers_file_parses(tmp_path: Path) -> None:
    assert sysusers_problems(tmp_path, UNITS / "buildmax.sysusers") == []
    mistaken = tmp_path / "mistaken.conf"
    mistaken.write_text(
        replaced((UNITS / "buildmax.sysusers").read_text(), "\nu     buildmax", "\nU buildmax")
    )
    assert sysusers_problems(tmp_path, mistaken) != []
    assert not (tmp_path / "etc").exists()  # a dry run: nothing written


def default_shutdown_grace_seconds() -> int:
    (grace,) = (f for f in dataclasses.fields(Config) if f.name == "shutdown_grace_seconds")
    assert isinstance(grace.default, int)
    return grace.default


def test_the_server_outlasts_its_grace_period_on_sigterm() -> None:
    text = unit_text(SERVER)
    grace = default_shutdown_grace_seconds()
    assert microseconds(unit_value(text, "Service", "TimeoutStopSec")) > grace * 1_000_000
    assert unit_value(text, "Service", "KillSignal") == "SIGTERM"
    assert unit_value(text, "Service", "KillMode") == "mixed"


def test_the_units_run_the_readme_venv() -> None:
    venv = readme_venv()
    install, upgrade = install_parts()
    for name in (SERVER, BACKUP):
        (command,) = unit_values(unit_text(name), "Service", "ExecStart")
        assert shlex.split(command)[0] == f"{venv}/bin/buildmax", name
    readme_binaries = set(re.findall(r"(\S+/bin/(?:buildmax|pip))\b", install + upgrade))
    assert readme_binaries == {f"{venv}/bin/buildmax", f"{venv}/bin/pip"}
    assert f"{venv}/bin/pip install -r requirements-server.txt" in commands(upgrade)


def test_the_readme_installs_and_enables_every_unit() -> None:
    install, _upgrade = install_parts()
    lines = commands(install)
    assert "cp deploy/systemd/buildmax.service /etc/systemd/system/" in lines
    assert (
        "cp deploy/systemd/buildmax-backup.service deploy/systemd/buildmax-backup.timer"
        " /etc/systemd/system/" in lines
    )
    enabled = [line for line in lines if line.startswith("systemctl daemon-reload && ")]
    assert enabled == [
        "systemctl daemon-reload && systemctl enable --now buildmax",
        "systemctl daemon-reload && systemctl enable --now buildmax-backup.timer",
    ]
    # The backup's target, owner-only, where the backup service writes.
    backup_dir = dict(
        a.split("=", 1)
        for v in unit_values(unit_text(BACKUP), "Service", "Environment")
        for a in shlex.split(v)
    )["BUILDMAX_BACKUP_DIR"]
    assert f"install -d -m 0700 -o buildmax -g buildmax {backup_dir}" in lines
    assert backup_dir in unit_value(unit_text(BACKUP), "Service", "ReadWritePaths").split()
    # The timer starts that service (the one of its own name).
    assert unit_values(unit_text(TIMER), "Timer", "Unit") in ([], [BACKUP])


# -- Slow: the README, rehearsed ----------------------------------------------


def uv_binary() -> str | None:
    """uv, for a faster ``pip install``: on the PATH, beside this Python, or
    from the uv package."""
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found:
        return found
    try:
        import uv  # type: ignore[import-not-found]
    except ImportError:
        return None
    return str(uv.find_uv_bin())


@dataclass
class Machine:
    """A temporary root standing for the machine the README installs on."""

    root: Path
    user: str = field(default_factory=lambda: pwd.getpwuid(os.getuid()).pw_name)
    group: str = field(default_factory=lambda: grp.getgrgid(os.getgid()).gr_name)

    def path(self, text: str) -> str:
        """``text`` with every machine path moved under the root."""
        return MACHINE_PATH.sub(lambda m: f"{self.root}{m.group(1)}", text)

    def on(self, path: str) -> Path:
        return Path(self.path(path))

    def base_env(self) -> dict[str, str]:
        """The environment a command of the steps runs in: this one,
        without BuildMax settings of the caller's."""
        return {k: v for k, v in os.environ.items() if not k.startswith("BUILDMAX_")}


#: Run after each command of the steps that names /etc/buildmax: the machine
#: paths in the files there (the configuration copied from deploy/) moved
#: under the root, as in the commands.
MAP_FILES = """\
import re
from pathlib import Path
pattern, root, folder = re.compile({pattern!r}), {root!r}, Path({folder!r})
for path in folder.glob("*") if folder.is_dir() else ():
    text = path.read_text() if path.is_file() else ""
    mapped = pattern.sub(lambda m: root + m.group(1), text)
    if mapped != text:
        path.write_text(mapped)
"""


def rehearsed(machine: Machine, lines: list[str], tmp_path: Path, replace: dict[str, str]) -> str:
    """The script that runs ``lines`` on ``machine``: as the current user,
    the paths mapped, without what needs a running systemd. Each key of
    ``replace`` must be in one of the lines; its value replaces it."""
    folder = machine.path("/etc/buildmax")
    helper = tmp_path / "map_files.py"
    helper.write_text(
        MAP_FILES.format(pattern=MACHINE_PATH.pattern, root=str(machine.root), folder=folder)
    )
    map_files = shlex.join([sys.executable, str(helper)])
    owners = {"-o": machine.user, "-g": machine.group}
    uv = uv_binary()
    script = ["set -euo pipefail"]
    unused = set(replace)
    for line in lines:
        if shlex.split(line)[0] in NEEDS_SYSTEMD:
            continue
        for old, new in replace.items():
            if old in line:
                line = line.replace(old, new)
                unused.discard(old)
        line = re.sub(
            r"(?<![\w./-])systemd-sysusers(?![\w.-])",
            f"systemd-sysusers --root={shlex.quote(str(machine.root))} --dry-run",
            line,
        )
        line = line.replace("runuser -u buildmax -- ", "")
        line = re.sub(r"(-[og]) buildmax\b", lambda m: f"{m.group(1)} {owners[m.group(1)]}", line)
        if uv:
            line = re.sub(
                r"(\S+)/bin/pip install", rf"{uv} pip install --python \1/bin/python", line
            )
        line = machine.path(line)
        script.append(line)
        if folder in line:
            script.append(map_files)
    assert not unused, f"no longer in the steps: {sorted(unused)}"
    return "\n".join(script) + "\n"


def checkout(tmp_path: Path) -> Path:
    """A copy of the repository's files (no version control, virtual
    environments or build output): the steps install from it, so that
    their build folders never meet another install from the same tree."""
    copy = tmp_path / "checkout"
    if not copy.exists():
        shutil.copytree(
            REPO,
            copy,
            ignore=shutil.ignore_patterns(
                ".git", ".tox", ".artifacts", "__pycache__", "build", "*.egg-info", ".*_cache"
            ),
        )
    return copy


def run_steps(
    machine: Machine, lines: list[str], tmp_path: Path, replace: dict[str, str] | None = None
) -> str:
    """Run the steps with bash from the root of a copy of the repository;
    their output."""
    script = tmp_path / f"steps-{uuid.uuid4().hex[:8]}.sh"
    script.write_text(rehearsed(machine, lines, tmp_path, replace or {}))
    result = subprocess.run(
        ["bash", str(script)],
        cwd=checkout(tmp_path),
        env=machine.base_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{script.read_text()}\n{output}"
    return output


@dataclass(frozen=True)
class Service:
    """How systemd would start an installed service, on the machine."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    text: str


def installed_service(machine: Machine, name: str) -> Service:
    """An installed unit's ExecStart=, Environment=, EnvironmentFile= and
    WorkingDirectory=, with the machine's paths."""
    text = machine.on(f"/etc/systemd/system/{name}").read_text()
    home = machine.path("/var/lib/buildmax")  # the sysusers file's home
    env = {"PATH": SERVICE_PATH, "LANG": "C.UTF-8", "HOME": home, "USER": machine.user}
    for value in unit_values(text, "Service", "Environment"):
        for assignment in shlex.split(value):
            key, _sep, setting = assignment.partition("=")
            env[key] = machine.path(setting)
    for value in unit_values(text, "Service", "EnvironmentFile"):
        path = machine.on(value.removeprefix("-"))
        if not path.exists():
            assert value.startswith("-"), f"{name}: {path} is missing"
            continue
        for line in path.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith(("#", ";")):
                key, _sep, setting = line.strip().partition("=")
                env[key] = setting
    (command,) = unit_values(text, "Service", "ExecStart")
    argv = [machine.path(word) for word in shlex.split(command)]
    cwd = machine.on(unit_value(text, "Service", "WorkingDirectory"))
    return Service(argv=argv, env=env, cwd=cwd, text=text)


def readyz(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code
    except OSError:
        return None


def serve_and_stop(service: Service, log: Path) -> None:
    """Start the server as its unit would, on a free port; /readyz must
    answer 200; then the unit's stop signal, and exit status 0 within its
    TimeoutStopSec=."""
    from buildmax.testing import free_port

    port = free_port()  # the unit's 8420 may be taken here
    env = {**service.env, "BUILDMAX_PORT": str(port)}
    stop_signal = signal.Signals[unit_value(service.text, "Service", "KillSignal")]
    timeout = microseconds(unit_value(service.text, "Service", "TimeoutStopSec")) / 1e6
    with log.open("wb") as out:
        process = subprocess.Popen(
            service.argv,
            cwd=service.cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and process.poll() is None:
            status = readyz(port)
            if status == 200:
                break
            time.sleep(0.2)
        assert status == 200, f"/readyz: {status}, exit {process.poll()}\n{log.read_text()}"
        process.send_signal(stop_signal)
        code = process.wait(timeout=timeout)
        assert code == 0, log.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # its own session: only what it started
            process.wait()


def back_up(service: Service) -> Path:
    """Run the backup service as its unit would; the one backup it made."""
    target = Path(service.env["BUILDMAX_BACKUP_DIR"])
    before = set(target.glob("buildmax-*"))
    result = subprocess.run(
        service.argv, cwd=service.cwd, env=service.env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    made = set(target.glob("buildmax-*")) - before
    assert len(made) == 1, (sorted(target.iterdir()), result.stdout + result.stderr)
    (backup,) = made
    assert (backup / "manifest.json").is_file()
    return backup


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    """A root with what a Debian machine already has: /etc/systemd/system
    (and the packaged units, for systemd-analyze verify)."""
    root = tmp_path / "machine"
    prepare_analysis_root(root)
    return Machine(root)


@pytest.mark.rehearsal
@pytest.mark.timeout(300)
def test_the_readme_install_on_one_machine(machine: Machine, tmp_path: Path) -> None:
    install, upgrade = install_parts()
    output = run_steps(machine, commands(install), tmp_path)
    assert "Creating user 'buildmax'" in output  # systemd-sysusers --dry-run read the file
    assert re.search(r"^bmx_\S+$", output, re.M), "admin bootstrap printed no token"

    # What the steps left behind.
    assert mode(machine.on("/etc/buildmax")) == 0o750
    assert mode(machine.on("/etc/buildmax/buildmax.toml")) == 0o640
    assert mode(machine.on("/var/lib/buildmax")) == 0o750
    assert mode(machine.on("/var/backups/buildmax")) == 0o700
    config = load_config(machine.on("/etc/buildmax/buildmax.toml"), environ={})
    assert config.data_dir == machine.path("/var/lib/buildmax")
    assert (machine.on("/var/lib/buildmax") / "buildmax.db").is_file()
    assert verify_problems(machine.root, *UNIT_FILES) == []  # with the real venv now

    # Each unit's ExecStart=, as written.
    server = installed_service(machine, SERVER)
    serve_and_stop(server, tmp_path / "serve.log")
    backup = back_up(installed_service(machine, BACKUP))
    assert (backup / "database.sqlite").is_file()

    # The upgrade: the same venv, the migrations (none pending), a restart.
    output = run_steps(machine, commands(upgrade), tmp_path)
    assert "Nothing to migrate" in output
    serve_and_stop(server, tmp_path / "serve-after-upgrade.log")


@pytest.mark.rehearsal
@pytest.mark.timeout(300)
def test_the_readme_install_on_postgresql(machine: Machine, tmp_path: Path) -> None:
    from buildmax.testing import pg_create_database, pg_drop_database

    install, _upgrade = install_parts()
    steps = numbered_steps(install)
    postgres = sh_blocks(readme_section(POSTGRES))
    name = f"bmx_systemd_{uuid.uuid4().hex[:12]}"
    url = pg_create_database(PG_SERVER, name)
    try:
        # Steps 1 and 2 of the install, the section's own, then step 5.
        lines = commands(steps[1] + steps[2])
        for block in postgres:
            lines += commands(block)
        lines += commands(steps[5])
        output = run_steps(machine, lines, tmp_path, {EXAMPLE_DATABASE_URL: url})
        assert "applied kernel 1" in output
        assert re.search(r"^bmx_\S+$", output, re.M), "admin bootstrap printed no token"

        assert mode(machine.on("/etc/buildmax/buildmax.env")) == 0o600
        environ = {"BUILDMAX_DATABASE_URL": url}
        config = load_config(machine.on("/etc/buildmax/buildmax.toml"), environ=environ)
        assert config.workers == 4
        assert not (machine.on("/var/lib/buildmax") / "buildmax.db").exists()

        server = installed_service(machine, SERVER)
        assert server.env["BUILDMAX_DATABASE_URL"] == url
        serve_and_stop(server, tmp_path / "serve.log")
        backup = back_up(installed_service(machine, BACKUP))
        assert (backup / "database.pgdump").is_file()
    finally:
        pg_drop_database(PG_SERVER, name)
