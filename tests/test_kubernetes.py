"""The Kubernetes example (``deploy/kubernetes/mldserver.yaml``) is valid Kubernetes and
cannot drift from the product:

- every object validates, strictly (no unknown field), against the Kubernetes JSON
  schemas kubernetes-validate bundles (offline), for the oldest and the newest
  Kubernetes versions the example supports;
- the container's args parse with mldserver's own command line into settings, and the
  ConfigMap's daemon properties pass ``mldserver run``'s own check; the files the args
  name are where the volumes put them; the user and the state directory are the image's
  (deploy/Containerfile);
- a real ``mldserver serve`` given the same admin flags and the Secret's token answers
  the probes' paths on the port they name, and refuses a POST without the token;
- terminationGracePeriodSeconds outlasts the stop: the daemon's shutdownGraceMillis, the
  time mldserver gives the daemon past it, then shutdown_timeout.

A mistake in the manifest fails here with the object and the field::

    problems(docs, "1.37.0")  # ["StatefulSet mldserver: spec.template...: Additional properties ..."]
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

import kubernetes_validate
import pytest
import yaml

from mldserver import cli
from mldserver.ops import daemon, properties

from .harness import MLDSERVER, ROOT, ServerProcess

MANIFEST = ROOT / "deploy" / "kubernetes" / "mldserver.yaml"
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
# The Kubernetes versions the example is checked against: the oldest one it supports
# (StatefulSet, startup probes and named probe ports are older) and the newest bundled.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
TOKEN = "0123456789abcdef0123456789abcdef"  # what `kubectl create secret ... --from-literal=token=` holds


def documents() -> list[dict]:
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]


def one(docs: list[dict], kind: str) -> dict:
    (found,) = [doc for doc in docs if doc["kind"] == kind]
    return found


def problems(docs: list[dict], version: str) -> list[str]:
    """Each object's schema errors against Kubernetes ``version``, strict (an unknown
    field, a misspelt one, is an error), as ``KIND NAME: what``."""
    found = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            found.append(f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}: {where}: {exc.message}")
    return found


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_is_valid_kubernetes(version):
    docs = documents()
    assert {doc["kind"] for doc in docs} == {"ServiceAccount", "ConfigMap", "Service", "StatefulSet"}
    assert problems(docs, version) == []


def misspell(container: dict) -> None:
    container["livenessProbe"]["httpGet"]["paht"] = container["livenessProbe"]["httpGet"].pop("path")


def quote(container: dict) -> None:
    container["ports"][0]["containerPort"] = "7071"


@pytest.mark.parametrize("mistake, found", [
    (misspell, "StatefulSet mldserver: spec.template.spec.containers.0.livenessProbe.httpGet: Additional "
               "properties are not allowed ('paht' was unexpected)"),
    (quote, "StatefulSet mldserver: spec.template.spec.containers.0.ports.0.containerPort: '7071' is not of "
            "type 'integer'"),
])
def test_the_validator_catches_a_misspelt_field_and_a_wrong_type(mistake, found):
    docs = documents()
    mistake(pod(docs)["containers"][0])
    assert problems(docs, VERSIONS[0]) == [found]


# -- the manifest against the product ------------------------------------------------------

def pod(docs: list[dict]) -> dict:
    return one(docs, "StatefulSet")["spec"]["template"]["spec"]


def mounted(docs: list[dict], path: str) -> tuple[str, str]:
    """Where ``path`` in the container comes from: (the volume's kind, the key or item)
    of the ConfigMap or Secret item mounted there, or (the volume's kind, "") for a path
    under any other volume."""
    spec = pod(docs)
    volumes = {v["name"]: v for v in spec["volumes"]}
    claims = {c["metadata"]["name"] for c in one(docs, "StatefulSet")["spec"].get("volumeClaimTemplates", [])}
    for mount in spec["containers"][0]["volumeMounts"]:
        rel = PurePosixPath(path).relative_to(mount["mountPath"]) if PurePosixPath(path).is_relative_to(
            mount["mountPath"]) else None
        if rel is None:
            continue
        if mount["name"] in claims:
            return "persistentVolumeClaim", ""
        volume = volumes[mount["name"]]
        for kind in ("configMap", "secret"):
            if kind in volume:
                items = {i["path"]: i["key"] for i in volume[kind].get("items", [])}
                return kind, items.get(str(rel), str(rel))
        return next(k for k in volume if k != "name"), ""
    raise AssertionError(f"{path}: no volume of the pod is mounted there")


def test_the_args_are_mldservers_and_the_files_they_name_are_mounted():
    docs = documents()
    container = pod(docs)["containers"][0]
    args = cli._parser().parse_args(container["args"])  # an unknown flag exits 2 here
    assert args.command == "run"
    config = one(docs, "ConfigMap")["data"]
    kind, key = mounted(docs, args.properties)
    assert (kind, key in config) == ("configMap", True), (args.properties, kind, key)
    module = args.handler.partition(":")[0]
    kind, key = mounted(docs, f"/handlers/{module.replace('.', '/')}.py")  # /handlers: the image's PYTHONPATH
    assert (kind, key in config) == ("configMap", True), (args.handler, kind, key)
    assert mounted(docs, args.admin_token_file) == ("secret", "token")
    state = PurePosixPath(image_workdir()) / "mldserver-state"  # the default state dir, in the working dir
    assert mounted(docs, str(state)) == ("persistentVolumeClaim", "")
    uid = int(re.search(r"useradd .*--uid (\d+)", CONTAINERFILE.read_text()).group(1))
    context = pod(docs)["securityContext"]
    assert (context["runAsUser"], context["fsGroup"], context["runAsNonRoot"]) == (uid, uid, True)


def image_workdir() -> str:
    """The runtime stage's WORKDIR in deploy/Containerfile (the last one set)."""
    return re.findall(r"^WORKDIR (\S+)", CONTAINERFILE.read_text(), re.M)[-1]


def configmap_files(tmp_path: Path) -> tuple[Path, Path]:
    """The ConfigMap's daemon properties and handler module, written as the pod sees them:
    (the properties file, the handlers folder)."""
    config = one(documents(), "ConfigMap")["data"]
    (tmp_path / "handlers").mkdir()
    for name, text in config.items():
        (tmp_path / ("handlers" if name.endswith(".py") else "") / name).write_text(text)
    return tmp_path / "app.properties", tmp_path / "handlers"


def test_run_takes_the_configmaps_properties_and_handler(tmp_path):
    """The settings ``mldserver run`` makes of the args, and its own check of the
    daemon's properties with them: no error. ``mldserver check`` imports the handler."""
    props_file, handlers = configmap_files(tmp_path)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    argv = [{"/config/app.properties": str(props_file)}.get(a, a) for a in pod(documents())["containers"][0]["args"]]
    argv[argv.index("--admin-token-file") + 1] = str(token)
    settings = cli._settings(cli._parser().parse_args(argv))
    findings = properties.check(properties.read(props_file), settings, run=True)
    assert [f.render(props_file) for f in findings if f.level == "error"] == []
    args = cli._parser().parse_args(argv)
    checked = subprocess.run([MLDSERVER, "check", "--properties", str(props_file), "--handler", args.handler],
                             cwd=tmp_path, env={**os.environ, "PYTHONPATH": f"{handlers}:{ROOT}"},
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and "0 errors" in checked.stdout, checked.stdout + checked.stderr


def test_the_grace_period_outlasts_the_stop(tmp_path):
    """SIGTERM: the daemon's graceful shutdown (shutdownGraceMillis, and the margin before
    mldserver kills it), then the shards' last calls (shutdown_timeout); the pod must not
    be killed before both."""
    docs = documents()
    props_file, _ = configmap_files(tmp_path)
    grace_ms = int(properties.read(props_file).value("shutdownGraceMillis"))
    argv = [a for a in pod(docs)["containers"][0]["args"]]
    argv[argv.index("--properties") + 1] = str(props_file)
    argv[argv.index("--admin-token-file") + 1] = str(tmp_path / "token")
    shutdown_timeout = cli._settings(cli._parser().parse_args(argv)).shutdown_timeout
    stop = grace_ms / 1000 + daemon.STOP_MARGIN_S + shutdown_timeout
    assert pod(docs)["terminationGracePeriodSeconds"] >= stop + 10, stop  # and room for the last commit


def get(url: str, method: str = "GET") -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_probes_answer_on_a_real_server_with_the_manifests_admin_flags(tmp_path):
    docs = documents()
    container = pod(docs)["containers"][0]
    args = cli._parser().parse_args(container["args"])
    host, _, port = args.admin.rpartition(":")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert host == "0.0.0.0" and ports["admin"] == int(port), (args.admin, ports)  # reachable by the kubelet
    probes = {name: container[name]["httpGet"] for name in ("startupProbe", "livenessProbe", "readinessProbe")}
    for probe in probes.values():
        assert ports.get(probe["port"], probe["port"]) == int(port), probe
    service = one(docs, "Service")["spec"]["ports"]
    assert [(p["port"], p["targetPort"]) for p in service] == [(int(port), "admin")]

    _, handlers = configmap_files(tmp_path)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    server = ServerProcess(args.handler, tmp_path, "--admin", f"{host}:0", "--admin-token-file", str(token),
                           env={"PYTHONPATH": f"{handlers}:{ROOT}"})
    try:
        url = server.admin_url
        assert url is not None, server.tail()
        url = url.replace("0.0.0.0", "127.0.0.1")
        for name, probe in probes.items():
            assert get(url + probe["path"]) == 200, (name, probe)
        assert get(url + "/nothing-here") == 404  # (a probe's path that the server has not would fail so)
        assert get(url + "/pause", "POST") == 401  # the Secret's token guards the writes
    finally:
        assert server.stop() == 0
