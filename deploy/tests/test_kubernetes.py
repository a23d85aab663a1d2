"""The Kubernetes manifests of deploy/kubernetes/, checked without a cluster.

Every manifest is validated offline, in strict mode (an unknown field is
refused), against the schemas of one pinned Kubernetes version that
kubernetes-validate ships; copies with a deliberate mistake each must fail
that validation. What no schema knows is checked against this project:
the commands the pods run are looked up in the real CLI, the configuration
file is loaded with the real loader, the environment variables are real
settings, and the drain fits in the termination grace period.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shlex
import tomllib
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import click
import pytest

import buildmax
from buildmax.commands import backup as backup_commands
from buildmax.commands import server as server_commands
from buildmax.config import ENV_PREFIX, Config, ConfigError, load_config

try:
    import kubernetes_validate
    import yaml
    from kubernetes_validate.utils import all_versions
except ImportError as exc:  # never a skip: the lint env installs both
    raise ImportError(
        f"{exc}: the Kubernetes manifest tests need kubernetes-validate and PyYAML "
        "(`pip install kubernetes-validate PyYAML`; the lint env installs them)"
    ) from exc

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
#: Examples to edit before applying: validated too, but not read by
#: `kubectl apply -f deploy/kubernetes/` (it does not descend into folders).
OPTIONAL = MANIFESTS / "optional"

#: The Kubernetes version whose schemas the manifests are validated against:
#: the oldest minor release maintained upstream when they were written
#: (December 2026: 1.35 to 1.37), so they use no field that a maintained
#: cluster lacks. kubernetes-validate ships the schemas: no network is used.
KUBERNETES_VERSION = "1.35.0"

#: The Secret the pods read and these manifests do not ship.
SECRET = "buildmax"
#: The image's user and group (the Dockerfile's USER).
IMAGE_UID = 10001
#: Seconds past the preStop sleep and shutdown_grace_seconds that the
#: shutdown hooks, the last bookkeeping writes and the exit get.
SHUTDOWN_MARGIN = 5
#: Environment variables of the AWS credential chain the S3 plugin reads.
AWS_VARIABLES = {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
}
#: Variables that hold a secret: only ever from a secretKeyRef.
SECRET_VARIABLES = {"BUILDMAX_DATABASE_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
#: Dummy values for them when a pod's settings are loaded here.
DUMMY_SECRETS = {
    "BUILDMAX_DATABASE_URL": "postgresql://buildmax:dummy@postgres.invalid:5432/buildmax",
    "AWS_ACCESS_KEY_ID": "dummy-access-key",
    "AWS_SECRET_ACCESS_KEY": "dummy-secret-key",
}
WORKLOADS = ("Deployment", "Job", "CronJob")
#: The command each workload must run, as a path in the `buildmax` CLI.
COMMANDS = {
    "Deployment": ("serve",),
    "Job": ("db", "migrate"),
    "CronJob": ("backup", "create"),
}


# -- Reading the manifests ----------------------------------------------------


def manifest_files() -> list[Path]:
    """What `kubectl apply -f deploy/kubernetes/` applies, in its order."""
    return sorted(path for path in MANIFESTS.iterdir() if path.suffix in (".yaml", ".yml", ".json"))


def optional_files() -> list[Path]:
    return sorted(OPTIONAL.glob("*.yaml"))


@cache
def _documents(path: Path) -> tuple[dict[str, Any], ...]:
    with path.open(encoding="utf-8") as fh:
        return tuple(doc for doc in yaml.safe_load_all(fh) if doc is not None)


def documents(path: Path) -> list[dict[str, Any]]:
    """The resources of ``path``, each a fresh copy the caller may change."""
    return copy.deepcopy(list(_documents(path)))


def resource(kind: str) -> dict[str, Any]:
    """The one resource of ``kind`` in deploy/kubernetes/."""
    found = [doc for path in manifest_files() for doc in documents(path) if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in {MANIFESTS}, found {len(found)}"
    return found[0]


def file_of(kind: str) -> Path:
    (path,) = [p for p in manifest_files() if any(d["kind"] == kind for d in documents(p))]
    return path


def pod_template(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod template of a Deployment, Job or CronJob."""
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]
    return doc["spec"]["template"]


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_template(doc)["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def only_container(doc: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_template(doc)["spec"]["containers"]
    return container


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions In/NotIn/
    Exists/DoesNotExist, or a Service's plain map) selects ``labels``; an
    empty one, which would select every pod, counts as selecting none."""
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return bool(selector.get("matchLabels") or selector.get("matchExpressions"))


def validate(doc: dict[str, Any], *, strict: bool = True) -> str:
    """Validate ``doc`` against the pinned version's schemas (no network);
    the version validated against."""
    return kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=strict)


# -- What the pods run with ---------------------------------------------------


@cache
def image_environment() -> dict[str, str]:
    """The ENV of the Dockerfile's last stage: the environment every
    container of the image starts with, under the manifests' own."""
    dockerfile = REPO / "Dockerfile"
    assert dockerfile.is_file(), f"{dockerfile}: the image these manifests run is built from it"
    lines = [
        line for line in dockerfile.read_text().splitlines() if not line.lstrip().startswith("#")
    ]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    env: dict[str, str] = {}
    for line in text.splitlines():
        keyword, _, rest = line.strip().partition(" ")
        if keyword.upper() == "FROM":
            env = {}
        elif keyword.upper() == "ENV":
            words = shlex.split(rest)
            if words and "=" not in words[0]:  # the old form, `ENV KEY value`
                env[words[0]] = rest.strip().partition(" ")[2].strip()
                continue
            for word in words:
                key, _, value = word.partition("=")
                env[key] = value
    return env


def config_text() -> str:
    """buildmax.toml, as the ConfigMap holds it."""
    return resource("ConfigMap")["data"]["buildmax.toml"]


def mounts(doc: dict[str, Any], container: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each of ``container``'s mounts: its path and the pod volume behind it."""
    volumes = {volume["name"]: volume for volume in pod_template(doc)["spec"].get("volumes", [])}
    found = []
    for mount in container.get("volumeMounts", []):
        assert mount["name"] in volumes, f"{container['name']} mounts an undefined volume"
        found.append((mount["mountPath"], {**volumes[mount["name"]], "mount": mount}))
    return found


def config_path_in_pod(doc: dict[str, Any], container: dict[str, Any]) -> str:
    """BUILDMAX_CONFIG of ``container``, checked to be the ConfigMap's file."""
    env = {var["name"]: var for var in container.get("env", [])}
    assert "value" in env.get("BUILDMAX_CONFIG", {}), f"{doc['kind']}: no BUILDMAX_CONFIG"
    path = PurePosixPath(env["BUILDMAX_CONFIG"]["value"])
    configmap = resource("ConfigMap")
    for mount_path, volume in mounts(doc, container):
        if path.parent != PurePosixPath(mount_path) or "configMap" not in volume:
            continue
        assert volume["configMap"]["name"] == configmap["metadata"]["name"]
        assert volume["mount"].get("readOnly") is True, "the configuration is mounted read-only"
        items = volume["configMap"].get("items")
        keys = {i["path"]: i["key"] for i in items} if items else {k: k for k in configmap["data"]}
        assert keys.get(path.name) == "buildmax.toml", f"{path}: not the ConfigMap's buildmax.toml"
        return str(path)
    raise AssertionError(f"{doc['kind']}: BUILDMAX_CONFIG={path} is on no ConfigMap mount")


def settings_of(doc: dict[str, Any], container: dict[str, Any], tmp_path: Path) -> Config:
    """The settings ``container`` runs with: the ConfigMap's file, the image's
    environment, then the container's (its secrets as dummy values)."""
    config_path_in_pod(doc, container)
    config_file = tmp_path / "buildmax.toml"
    config_file.write_text(config_text())
    environ = dict(image_environment())
    for var in container.get("env", []):
        if "value" in var:
            environ[var["name"]] = var["value"]
        elif "secretKeyRef" in var.get("valueFrom", {}):
            environ[var["name"]] = DUMMY_SECRETS[var["name"]]
    environ["BUILDMAX_CONFIG"] = str(config_file)
    params = cli_command(container["args"])[1]
    return load_config(
        environ=environ, data_dir=params.get("data_dir"), database_url=params.get("database_url")
    )


def cli_command(args: list[str]) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The command ``args`` name in the real `buildmax` CLI and its parsed
    parameters: a click.UsageError for an unknown command or option, or a
    bad value, as `buildmax <args>` would refuse them."""
    root = click.Group("buildmax")
    server_commands.register(root)
    backup_commands.register(root)
    ctx = click.Context(root, info_name="buildmax")
    command: click.Command = root
    remaining = list(args)
    path: list[str] = []
    while isinstance(command, click.Group):
        if not remaining:
            raise click.UsageError(f"`buildmax {' '.join(path)}` needs a command", ctx)
        name, found, remaining = command.resolve_command(ctx, remaining)
        assert name is not None and found is not None
        path.append(name)
        command = found
        if isinstance(command, click.Group):
            ctx = click.Context(command, info_name=name, parent=ctx)
    leaf = command.make_context(path[-1], remaining, parent=ctx)
    return tuple(path), leaf.params


def security(doc: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """``container``'s effective security context (its own over the pod's)."""
    pod = pod_template(doc)["spec"].get("securityContext", {})
    own = container.get("securityContext", {})
    shared = ("runAsNonRoot", "runAsUser", "runAsGroup", "seccompProfile")
    return {**{key: pod[key] for key in shared if key in pod}, **own}


def prestop_seconds(container: dict[str, Any]) -> int:
    """How long the preStop hook sleeps (the sleep action, or exec `sleep N`)."""
    hook = container["lifecycle"]["preStop"]
    if "sleep" in hook:
        return int(hook["sleep"]["seconds"])
    command = hook["exec"]["command"]
    assert command[0] in ("sleep", "/bin/sleep", "/usr/bin/sleep") and len(command) == 2
    return int(command[1])


def port_number(container: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port (a number or a port name) as a number."""
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
    assert port in named, f"no container port named {port!r}"
    return named[port]


def workloads() -> Iterator[dict[str, Any]]:
    for kind in WORKLOADS:
        yield resource(kind)


# -- 1. Strict validation against the pinned version ---------------------------


def test_the_pinned_version_is_shipped_offline() -> None:
    available = all_versions()
    assert KUBERNETES_VERSION in available, (
        f"kubernetes-validate {kubernetes_validate.__version__} has no schemas of "
        f"{KUBERNETES_VERSION} (it has {available[0]} to {available[-1]}): "
        "move KUBERNETES_VERSION to a maintained release it has"
    )


def test_the_layout_applies_in_order() -> None:
    files = manifest_files()
    names = [path.name for path in files]
    assert names[0] == "00-configmap.yaml", names
    kinds = []
    for path in [*files, *optional_files()]:
        assert re.fullmatch(r"\d\d-[a-z0-9-]+\.yaml", path.name), path.name
        text = path.read_text()
        assert text.startswith("# "), f"{path.name} starts with no comment saying what it is for"
        assert "What to change" in text or "what to change" in text, path.name
        docs = documents(path)
        assert len(docs) == 1, f"{path.name}: one resource per file"
        kinds.append(docs[0]["kind"])
    assert len(kinds) == len(set(kinds)), f"one kind per file: {kinds}"
    order = {doc["kind"]: i for i, path in enumerate(files) for doc in documents(path)}
    assert order["ConfigMap"] < order["Job"] < order["Deployment"]
    assert order["PersistentVolumeClaim"] < order["CronJob"]
    assert "Secret" not in order, "the Secret is referenced, never shipped"


@pytest.mark.parametrize(
    "path",
    [*manifest_files(), *optional_files()],
    ids=lambda path: str(path.relative_to(MANIFESTS)),
)
def test_manifest_validates_strictly(path: Path) -> None:
    for doc in documents(path):
        try:
            version = validate(doc)
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(exc.message)
        assert version == KUBERNETES_VERSION.rsplit(".", 1)[0]


# -- 2. A mistake fails the validation -----------------------------------------


def _replicas_as_words(doc: dict[str, Any]) -> None:
    doc["spec"]["replicas"] = "two"


def _misspelled_probe(doc: dict[str, Any]) -> None:
    container = only_container(doc)
    container["readinesProbe"] = container.pop("readinessProbe")


def _probe_port_as_list(doc: dict[str, Any]) -> None:
    only_container(doc)["livenessProbe"]["httpGet"]["port"] = [8420]


def _args_as_one_string(doc: dict[str, Any]) -> None:
    only_container(doc)["args"] = " ".join(only_container(doc)["args"])


def _misspelled_volume_mounts(doc: dict[str, Any]) -> None:
    container = only_container(doc)
    container["volumeMount"] = container.pop("volumeMounts")


def _service_port_as_words(doc: dict[str, Any]) -> None:
    doc["spec"]["ports"][0]["port"] = "eighty"


def _config_as_table(doc: dict[str, Any]) -> None:
    doc["data"]["buildmax.toml"] = {"host": "0.0.0.0"}


def _pdb_selector_as_string(doc: dict[str, Any]) -> None:
    doc["spec"]["selector"] = "app.kubernetes.io/name=buildmax"


MISTAKES: list[tuple[str, str, Callable[[dict[str, Any]], None]]] = [
    ("replicas-two", "Deployment", _replicas_as_words),
    ("readinesProbe", "Deployment", _misspelled_probe),
    ("probe-port-list", "Deployment", _probe_port_as_list),
    ("job-args-string", "Job", _args_as_one_string),
    ("cronjob-volumeMount", "CronJob", _misspelled_volume_mounts),
    ("service-port-words", "Service", _service_port_as_words),
    ("configmap-table", "ConfigMap", _config_as_table),
    ("pdb-selector-string", "PodDisruptionBudget", _pdb_selector_as_string),
]


@pytest.mark.parametrize(
    ("kind", "mistake"), [(kind, fn) for _, kind, fn in MISTAKES], ids=[m[0] for m in MISTAKES]
)
def test_a_mistake_fails_validation(kind: str, mistake: Callable[[dict[str, Any]], None]) -> None:
    doc = resource(kind)
    mistake(doc)
    assert doc != resource(kind)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(doc)


def test_strict_mode_is_what_refuses_an_unknown_field() -> None:
    doc = resource("Deployment")
    _misspelled_probe(doc)
    assert validate(doc, strict=False)
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        validate(doc)


# -- 3. What the schema cannot know --------------------------------------------


def test_two_servers_roll_one_at_a_time() -> None:
    deployment = resource("Deployment")
    assert deployment["spec"]["replicas"] == 2
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}


def test_probes_ask_the_server_port(tmp_path: Path) -> None:
    deployment = resource("Deployment")
    container = only_container(deployment)
    settings = settings_of(deployment, container, tmp_path)
    assert port_number(container, "http") == settings.port == 8420
    expected = {"readinessProbe": "/readyz", "livenessProbe": "/livez"}
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert port_number(container, get["port"]) == settings.port, probe
    # A slow start (opening the database, checking migrations) is not
    # killed by the liveness probe.
    startup = container.get("startupProbe")
    if startup is not None:
        assert startup["httpGet"]["path"] == "/livez"
        assert port_number(container, startup["httpGet"]["port"]) == settings.port
        assert startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3) >= 30
    else:
        assert container["livenessProbe"].get("initialDelaySeconds", 0) >= 30
    # Listening where the kubelet and the Service reach it.
    assert settings.host in ("0.0.0.0", "::")


def test_termination_grace_covers_the_drain(tmp_path: Path) -> None:
    deployment = resource("Deployment")
    container = only_container(deployment)
    # The ConfigMap's value (10, the default, if it sets none), unless the
    # image's or the pod's environment overrides it.
    grace = settings_of(deployment, container, tmp_path).shutdown_grace_seconds
    prestop = prestop_seconds(container)
    assert prestop >= 1
    period = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert period >= prestop + grace + SHUTDOWN_MARGIN, (
        f"terminationGracePeriodSeconds {period} leaves no room for the preStop sleep "
        f"({prestop}), the drain (shutdown_grace_seconds {grace}) and the shutdown"
    )


@pytest.mark.parametrize("kind", WORKLOADS)
def test_pods_run_real_commands(kind: str) -> None:
    container = only_container(resource(kind))
    assert "command" not in container, "the image's ENTRYPOINT (`buildmax`) runs the args"
    path, params = cli_command(container["args"])
    assert path == COMMANDS[kind]
    if kind == "CronJob":
        assert params["keep"] == 7


def test_a_renamed_command_or_option_is_refused() -> None:
    for args in (["db", "migrat"], ["backup", "create", "--kep", "7"], ["backup"], ["srv"]):
        with pytest.raises(click.UsageError):
            cli_command(args)


def test_selectors_find_the_server_pods_only() -> None:
    deployment = resource("Deployment")
    labels = pod_template(deployment)["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"], labels)
    service, pdb = resource("Service"), resource("PodDisruptionBudget")
    assert selects(service["spec"]["selector"], labels)
    assert selects(pdb["spec"]["selector"], labels)
    for constraint in pod_template(deployment)["spec"]["topologySpreadConstraints"]:
        assert selects(constraint["labelSelector"], labels)
    # A migration or backup pod never gets the server's traffic, nor counts
    # as one of its available pods.
    for kind in ("Job", "CronJob"):
        other = pod_template(resource(kind))["metadata"]["labels"]
        assert not selects(service["spec"]["selector"], other), kind
        assert not selects(pdb["spec"]["selector"], other), kind
    # A node drain can proceed: one pod may always go.
    assert 1 <= pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"]) == ("http", 80)
    assert port_number(only_container(deployment), port["targetPort"]) == 8420


def test_spread_over_nodes() -> None:
    spec = pod_template(resource("Deployment"))["spec"]
    keys = {c["topologyKey"] for c in spec.get("topologySpreadConstraints", [])}
    anti = spec.get("affinity", {}).get("podAntiAffinity")
    assert "kubernetes.io/hostname" in keys or anti


def test_secrets_come_from_one_secret() -> None:
    refs: dict[str, str] = {}
    for doc in workloads():
        for container in containers(doc):
            names = set()
            for var in container.get("env", []):
                names.add(var["name"])
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if var["name"] in SECRET_VARIABLES:
                    assert ref is not None, f"{doc['kind']}: {var['name']} only from the Secret"
                if ref is None:
                    continue
                assert ref["name"] == SECRET, f"{doc['kind']}: {var['name']} from {ref['name']}"
                assert not ref.get("optional"), f"{doc['kind']}: {var['name']} is required"
                assert refs.setdefault(var["name"], ref["key"]) == ref["key"], var["name"]
            missing = SECRET_VARIABLES - names
            assert not missing, f"{doc['kind']} lacks {missing}"
            assert not container.get("envFrom"), "every variable is named"
    # The documented `kubectl create secret` makes every key the pods read.
    created = set(re.findall(r"--from-literal=([a-z0-9-]+)=", file_of("ConfigMap").read_text()))
    assert set(refs.values()) <= created, set(refs.values()) - created


def test_environment_variables_are_settings() -> None:
    settings = [f.name for f in dataclasses.fields(Config) if f.name != "plugins"]
    known = {ENV_PREFIX + "CONFIG", *(ENV_PREFIX + name.upper() for name in settings)}
    known |= AWS_VARIABLES
    for doc in workloads():
        for container in containers(doc):
            for var in container.get("env", []):
                assert var["name"] in known, f"{doc['kind']}: {var['name']} is no setting"


def test_the_configuration_loads(tmp_path: Path) -> None:
    path = tmp_path / "buildmax.toml"
    path.write_text(config_text())
    written = load_config(path, environ={})
    # No secret in the ConfigMap: no database URL, no credentials in a URL.
    assert written.database_url == ""
    assert not re.search(r"://[^/\"]*@", json.dumps(tomllib.loads(config_text())))
    assert written.strict_plugins is True
    assert written.log_format == "json"
    assert written.trusted_proxies
    settings = load_config(path, environ=DUMMY_SECRETS)
    # Two servers share the database and the blobs.
    assert settings.engine == "postgresql"
    assert settings.blob_store_url.startswith("s3://")
    from buildmax_s3.store import S3BlobStore

    store = S3BlobStore.from_url(settings.blob_store_url, settings)
    assert store.settings.endpoint_url or store.settings.region
    # Only settings that differ from the defaults.
    defaults = Config()
    for key in tomllib.loads(config_text()).keys() - {"plugins"}:
        assert getattr(written, key) != getattr(defaults, key), f"{key} is the default"


def test_service_links_are_off() -> None:
    # A Service named `buildmax` makes Kubernetes put BUILDMAX_PORT=tcp://...
    # (and BUILDMAX_SERVICE_HOST, ...) into every pod of the namespace that
    # is started after it, unless enableServiceLinks is false; the server
    # reads BUILDMAX_PORT as its port setting and refuses to start.
    with pytest.raises(ConfigError, match="BUILDMAX_PORT"):
        load_config(environ={"BUILDMAX_PORT": "tcp://10.96.0.12:80"})
    for doc in workloads():
        assert pod_template(doc)["spec"].get("enableServiceLinks") is False, doc["kind"]


@pytest.mark.parametrize("kind", WORKLOADS)
def test_containers_run_unprivileged(kind: str) -> None:
    doc = resource(kind)
    spec = pod_template(doc)["spec"]
    assert spec.get("automountServiceAccountToken") is False
    assert not any("hostPath" in volume for volume in spec.get("volumes", []))
    assert not spec.get("hostNetwork") and not spec.get("hostPID")
    assert spec["securityContext"].get("fsGroup") == IMAGE_UID
    for container in containers(doc):
        context = security(doc, container)
        assert context.get("runAsNonRoot") is True
        assert context.get("runAsUser") == IMAGE_UID != 0
        assert context.get("runAsGroup", IMAGE_UID) == IMAGE_UID
        assert context.get("allowPrivilegeEscalation") is False
        assert context.get("readOnlyRootFilesystem") is True
        assert not context.get("privileged")
        assert "ALL" in context.get("capabilities", {}).get("drop", [])
        assert not context.get("capabilities", {}).get("add")
        assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault"
        assert "memory" in container["resources"]["limits"]
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])


@pytest.mark.parametrize("kind", WORKLOADS)
def test_written_paths_are_volumes(kind: str, tmp_path: Path) -> None:
    doc = resource(kind)
    container = only_container(doc)
    settings = settings_of(doc, container, tmp_path)
    environ = {**image_environment(), **{v["name"]: v.get("value") for v in container["env"]}}
    temp = environ.get("TMPDIR") or "/tmp"
    spool = settings.plugins.get("s3", {}).get("spool_dir") or temp
    written = {"data_dir": settings.data_dir, "temporary files": temp, "S3 upload parts": spool}
    if kind == "CronJob":
        output = cli_command(container["args"])[1]["output"]
        written["backup target"] = output or settings.backup_dir
    writable = [
        (PurePosixPath(path), volume)
        for path, volume in mounts(doc, container)
        if not volume["mount"].get("readOnly")
    ]
    for what, path in written.items():
        assert PurePosixPath(path).is_absolute(), f"{what} {path}: relative to the image's WORKDIR"
        under = [v for mount, v in writable if PurePosixPath(path).is_relative_to(mount)]
        assert under, f"{kind}: {what} ({path}) is on the read-only root filesystem"
        volume = under[-1]
        assert "emptyDir" in volume or "persistentVolumeClaim" in volume, (what, volume)
    if kind == "CronJob":
        target = PurePosixPath(written["backup target"])
        claims = [v for m, v in writable if target.is_relative_to(m)]
        assert "persistentVolumeClaim" in claims[-1], "the backups outlive the pod: on a claim"
        claim = claims[-1]["persistentVolumeClaim"]["claimName"]
        assert claim == resource("PersistentVolumeClaim")["metadata"]["name"]


def test_image_and_version_labels_are_this_release() -> None:
    version = buildmax.__version__
    for path in manifest_files():
        for doc in documents(path):
            labels = doc["metadata"]["labels"]
            assert labels["app.kubernetes.io/name"] == "buildmax"
            assert labels.get("app.kubernetes.io/version", version) == version, path.name
    for doc in workloads():
        assert pod_template(doc)["metadata"]["labels"]["app.kubernetes.io/version"] == version
        for container in containers(doc):
            assert container["image"] == f"buildmax:{version}", doc["kind"]


def test_migration_job_runs_once_per_apply() -> None:
    job = resource("Job")
    assert job["metadata"]["name"] == "buildmax-migrate"
    assert job["spec"]["backoffLimit"] <= 3
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("Never", "OnFailure")


def test_backup_runs_nightly_one_at_a_time() -> None:
    cronjob = resource("CronJob")
    assert cronjob["metadata"]["name"] == "buildmax-backup"
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    minute, hour, day, month, weekday = cronjob["spec"]["schedule"].split()
    assert minute.isdigit() and hour.isdigit() and (day, month, weekday) == ("*", "*", "*")
    assert pod_template(cronjob)["spec"]["restartPolicy"] in ("Never", "OnFailure")


def test_the_ingress_example_passes_the_largest_upload_and_event_streams() -> None:
    from buildmax_artifacts.settings import ArtifactSettings
    from buildmax_marketplace.settings import MarketplaceSettings

    (path,) = optional_files()
    (ingress,) = documents(path)
    service = resource("Service")
    for rule in ingress["spec"]["rules"]:
        for route in rule["http"]["paths"]:
            backend = route["backend"]["service"]
            assert backend["name"] == service["metadata"]["name"]
            assert backend["port"] in ({"name": "http"}, {"number": 80})
    annotations = ingress["metadata"]["annotations"]
    size = annotations["nginx.ingress.kubernetes.io/proxy-body-size"]
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    limit = int(size[:-1]) * units[size[-1].lower()]
    largest = max(MarketplaceSettings().max_package_bytes, ArtifactSettings().max_bytes)
    assert limit >= largest
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert annotations["nginx.ingress.kubernetes.io/proxy-request-buffering"] == "off"
    read_timeout = int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"])
    assert read_timeout > 2 * Config().events_keepalive_seconds
