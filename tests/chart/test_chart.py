"""The Helm chart (charts/supertable), the images and compose.yaml, checked without a cluster or a container engine:
helm lint and template for every values profile, every rendered manifest against the Kubernetes 1.29-1.31 schemas
(custom resources against their CRDs' documented fields), invariants over the rendered manifests, the values
schema's refusals, the Dockerfiles read statically, and compose.yaml against the chart (docs/kubernetes.md)."""

from __future__ import annotations

import copy
import fnmatch
import json
import re
from typing import Any

import pytest
import yaml
from chart_support import (
    CHART,
    COMPONENT_LABEL,
    DEV_COMPONENTS,
    K8S_VERSIONS,
    PROJECT_COMPONENTS,
    READ_PATH_GATEWAY_ENV,
    READ_PATH_PROGRAMS,
    RENDERS,
    ROOT,
    Pod,
    Program,
    by_kind,
    component,
    compose_config,
    console_scripts,
    exec_form,
    flags,
    help_flags,
    image_tag,
    iter_env,
    parse_dockerfile,
    pods,
    project_module_file,
    reads_env,
    render,
    run_helm,
    split_program,
    template_args,
    validation_errors,
)

PROFILES = ["values.yaml", "values-dev.yaml", "values-production.yaml"]
ALL = list(RENDERS)
GiB = 1 << 30


def _quantity(q: str | int | float) -> float:
    """A Kubernetes quantity (or a Spark memory string like 2g) as a number of bytes or cores."""
    if isinstance(q, int | float):
        return float(q)
    m = re.fullmatch(r"([0-9.]+)(m|k|Ki|Mi|Gi|Ti|M|G|T|g)?", q)
    assert m, f"not a quantity: {q!r}"
    scale = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": GiB}
    scale |= {"Ti": 1 << 40, "g": GiB, None: 1}
    return float(m.group(1)) * scale[m.group(2)]


def _project_pods(name: str) -> list[Pod]:
    return [p for p in pods(render(name)) if p.component in PROJECT_COMPONENTS]


def _workload(docs: tuple[dict[str, Any], ...], kind: str, comp: str) -> dict[str, Any]:
    (found,) = [d for d in by_kind(docs, kind) if component(d) == comp]
    return found


def _container(name: str, comp: str) -> dict[str, Any]:
    (pod,) = [p for p in pods(render(name)) if p.component == comp]
    return pod.containers[0]


def _argv(container: dict[str, Any]) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def _env_value(container: dict[str, Any], docs: tuple[dict[str, Any], ...], name: str) -> str:
    (entry,) = [e for e in container["env"] if e["name"] == name]
    if "value" in entry:
        return str(entry["value"])
    ref = entry["valueFrom"]["configMapKeyRef"]
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == ref["name"]]
    return str(cm["data"][ref["key"]])


# --- helm lint and template; every manifest against the Kubernetes schemas ------------------------------------------


@pytest.mark.parametrize("values", PROFILES)
def test_helm_lint_passes(values: str) -> None:
    out = run_helm("lint", "--strict", str(CHART), "-f", str(CHART / values))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


def test_helm_is_the_pinned_version() -> None:
    out = run_helm("version", "--short")
    assert out.returncode == 0 and out.stdout.startswith("v4.3.1"), out.stdout + out.stderr


@pytest.mark.parametrize("name", ALL)
def test_every_manifest_validates_against_kubernetes(name: str) -> None:
    """Strict schemas (unknown fields are errors) of Kubernetes 1.29, 1.30 and 1.31; SparkApplication and
    ServiceMonitor against their CRDs' documented fields. Every kind has a schema: nothing is skipped."""
    docs = render(name)
    assert docs
    # Spark's executor pod template travels in a ConfigMap: it is a Pod manifest too
    embedded = [
        yaml.safe_load(text)
        for cm in by_kind(docs, "ConfigMap")
        for key, text in cm["data"].items()
        if key.endswith("-template.yaml")
    ]
    for pod in embedded:
        pod["metadata"]["name"] = "spark-executor-template"
    errors = [e for d in [*docs, *embedded] for v in K8S_VERSIONS for e in validation_errors(d, v)]
    assert not errors, "\n".join(errors)
    if name == "ingest-job-k8s":
        (template,) = embedded
        sc = template["spec"]["containers"][0]["securityContext"]
        assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"]


def test_validation_catches_what_the_api_server_would_refuse() -> None:
    """The validators really validate: a misspelt field, a wrong type and an invented CRD field all fail."""
    deployment = copy.deepcopy(_workload(render("default"), "Deployment", "gateway"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    assert validation_errors(deployment, "1.30")
    deployment = copy.deepcopy(_workload(render("default"), "Deployment", "gateway"))
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8000"
    assert validation_errors(deployment, "1.29")
    (app,) = by_kind(render("ingest-sparkapp"), "SparkApplication")
    app = copy.deepcopy(app)
    app["spec"]["driver"]["coreLimits"] = "1"
    assert validation_errors(app, "1.31")
    (monitor, *_) = by_kind(render("production"), "ServiceMonitor")
    monitor = copy.deepcopy(monitor)
    monitor["spec"]["endpoints"][0]["interval"] = "30 seconds"
    assert validation_errors(monitor, "1.31")


def test_profiles_render_what_they_promise() -> None:
    default = {(d["kind"], component(d)) for d in render("default") if COMPONENT_LABEL in d["metadata"]["labels"]}
    assert {
        ("Deployment", "gateway"),
        ("Service", "gateway"),
        ("HorizontalPodAutoscaler", "gateway"),
        ("PodDisruptionBudget", "gateway"),
        ("Deployment", "query"),
        ("HorizontalPodAutoscaler", "query"),
        ("PodDisruptionBudget", "query"),
        ("StatefulSet", "cache"),
        ("Service", "cache"),
        ("PodDisruptionBudget", "cache"),
        ("Deployment", "builder"),
        ("NetworkPolicy", "cache"),
        ("NetworkPolicy", "query"),
    } <= default, default
    assert _workload(render("default"), "Deployment", "builder")["spec"]["replicas"] == 2
    dev = {component(d) for d in render("dev") if COMPONENT_LABEL in d["metadata"]["labels"]}
    assert {"redis", "kafka", "s3"} <= dev
    assert not {"redis", "kafka", "s3"} & {component(p.workload) for p in pods(render("production"))}
    assert by_kind(render("production"), "ServiceMonitor")
    assert by_kind(render("ingest-sparkapp"), "SparkApplication")
    assert by_kind(render("ingest-job-local"), "Job")
    for name in ALL:
        docs = render(name)
        secrets = {d["metadata"]["name"] for d in by_kind(docs, "Secret")}
        (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(cm["data"]["supertable.json"]) == json.loads(
            (ROOT / "deploy/grafana/dashboards/supertable.json").read_text()
        )
        sa = {d["metadata"]["name"] for d in by_kind(docs, "ServiceAccount")}
        for pod in pods(docs):
            account = pod.spec.get("serviceAccountName") or pod.workload["spec"].get("driver", {}).get("serviceAccount")
            if pod.component in PROJECT_COMPONENTS:
                assert account in sa, (name, pod.component)
            for c in pod.containers:
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    # values-production.yaml names Secrets of your own (existingSecret)
                    if ref and "values-production.yaml" not in RENDERS[name][0]:
                        assert ref["name"] in secrets, (name, e)


# --- invariants over every container ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_every_container_is_bounded_probed_and_unprivileged(name: str) -> None:
    problems = []
    for pod in pods(render(name)):
        pod_sc = pod.spec.get("securityContext", {})
        for c in pod.containers:
            where = f"{pod.workload['kind']}/{pod.workload['metadata']['name']}/{c['name']}"
            sc = c.get("securityContext", {})
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                if not {"cpu", "memory"} <= set(res.get(part, {})):
                    problems.append(f"{where}: {part} must set cpu and memory")
            if not pod.is_hook:  # a one-shot hook (the dev S3 buckets) has no long-running process to probe
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    if probe not in c:
                        problems.append(f"{where}: no {probe}")
            if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
                problems.append(f"{where}: runAsNonRoot")
            if sc.get("runAsUser", pod_sc.get("runAsUser")) in (0, None):
                problems.append(f"{where}: runs as root (no runAsUser)")
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where}: readOnlyRootFilesystem")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: allowPrivilegeEscalation")
            if sc.get("capabilities", {}).get("drop") != ["ALL"]:
                problems.append(f"{where}: capabilities not dropped")
            tag = image_tag(c["image"])
            if not tag or tag == "latest":
                problems.append(f"{where}: image {c['image']} has no pinned tag")
            ports = {p["name"] for p in c.get("ports", []) if "name" in p}
            if len(ports) != len(c.get("ports", [])):
                problems.append(f"{where}: unnamed port")
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                action = c.get(probe, {}).get("httpGet") or c.get(probe, {}).get("tcpSocket")
                if action and action["port"] not in ports:
                    problems.append(f"{where}: {probe} on port {action['port']}, not a named port of the container")
            mounts = {m["name"] for m in c.get("volumeMounts", [])}
            volumes = {v["name"] for v in pod.spec.get("volumes", [])}
            claims = {t["metadata"]["name"] for t in pod.workload["spec"].get("volumeClaimTemplates", [])}
            if mounts - volumes - claims:
                problems.append(f"{where}: mounts undeclared volumes {mounts - volumes - claims}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", ALL)
def test_long_running_tiers_spread_over_zones_and_nodes(name: str) -> None:
    for pod in _project_pods(name):
        if pod.workload["kind"] not in ("Deployment", "StatefulSet"):
            continue
        keys = {t["topologyKey"] for t in pod.spec.get("topologySpreadConstraints", [])}
        assert keys == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}, pod.component
        for t in pod.spec["topologySpreadConstraints"]:
            assert t["labelSelector"]["matchLabels"].items() <= pod.labels.items()
    if name == "production":
        for pod in _project_pods(name):
            if pod.workload["kind"] in ("Deployment", "StatefulSet"):
                required = pod.spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                assert required[0]["labelSelector"]["matchLabels"].items() <= pod.labels.items()


def test_probes_use_endpoints_the_services_serve() -> None:
    """/healthz and /readyz where the service has them (the gateway's routes, which the query service serves too,
    and the cache node's), /metrics on the builder and the ingest job, which serve nothing else
    (superfile.telemetry.serve: the Prometheus client library's server, which answers the metrics on any path)."""

    def routes(path: str) -> set[str]:
        app = (ROOT / path).read_text()
        return {p for p in ("/healthz", "/readyz") if f'@app.get("{p}"' in app}

    query = (ROOT / "services/query/superfile_query/app.py").read_text()
    assert "create_app as create_gateway_app" in query, "the query service is the gateway's app: its routes"
    telemetry = (ROOT / "libs/superfile/superfile/telemetry.py").read_text()
    served = {
        "gateway": routes("services/gateway/superfile_gateway/app.py"),
        "query": routes("services/gateway/superfile_gateway/app.py"),
        "cache": routes("services/cache/superfile_cache/app.py"),
        "builder": {"/metrics"} if "start_http_server(" in telemetry else set(),
        "ingest": {"/metrics"} if "start_http_server(" in telemetry else set(),
    }
    for name in ALL:
        for pod in _project_pods(name):
            c = pod.containers[0]
            paths = {c[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
            assert paths <= served[pod.component], (name, pod.component, paths)
    for comp in ("gateway", "query", "cache"):
        c = _container("default", comp)
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", comp
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", comp


@pytest.mark.parametrize("name", ALL)
def test_servers_listen_beyond_the_pods_loopback(name: str) -> None:
    """The gateway, query and cache processes listen on 127.0.0.1 unless told otherwise: the chart tells them
    (probes and the other tiers reach them on the pod's address)."""
    docs = render(name)
    for pod in _project_pods(name):
        c = pod.containers[0]
        if pod.component == "gateway":
            assert _env_value(c, docs, "SUPERFILE_HOST") == "0.0.0.0"
        elif pod.component in ("query", "cache"):
            assert "--host=0.0.0.0" in c["args"], pod.component


# --- commands: console scripts the project defines, flags their --help accepts --------------------------------------


def _programs() -> dict[Program, set[str]]:
    """Every project program a rendered manifest starts, with every flag passed to it in any render."""
    found: dict[Program, set[str]] = {}
    for name in ALL:
        docs = render(name)
        for pod in pods(docs):
            if pod.component not in PROJECT_COMPONENTS:
                continue
            if pod.workload["kind"] == "SparkApplication":
                spec = pod.workload["spec"]
                path = spec["mainApplicationFile"]
                m = re.fullmatch(r"local:///opt/venv/lib/python3\.11/site-packages/(.+)\.py", path)
                assert m, f"the driver runs {path}, not a module installed in the image's virtualenv"
                program, args = Program(("python", "-m", m.group(1).replace("/", "."))), spec["arguments"]
            else:
                c = pod.containers[0]
                assert c.get("command"), f"{pod.component}: the chart states the command, not the image"
                program, args = split_program(_argv(c))
            found.setdefault(program, set()).update(flags(args))
    return found


PROGRAMS = _programs()


@pytest.mark.parametrize("program", sorted(PROGRAMS, key=lambda p: p.label), ids=lambda p: p.label)
def test_every_command_is_a_project_program_and_every_flag_is_accepted(program: Program) -> None:
    head = program.argv[0]
    if head in ("python", "python3"):
        # python -m on a module of the project's own packages (the gateway and the ingest job have no console
        # script: their pyproject.toml defines none)
        assert project_module_file(program.argv[2]), f"{program.label}: not a module of the project"
    else:
        assert head in console_scripts(), f"{head} is not a console script any pyproject.toml defines"
    unknown = PROGRAMS[program] - help_flags(program)
    assert not unknown, f"{program.label} --help does not accept {sorted(unknown)}"


def test_the_read_path_tiers_run_their_console_scripts() -> None:
    assert {p.label for p in PROGRAMS if p.argv[0] in ("superfile-query", "superfile-cache")} == READ_PATH_PROGRAMS
    assert {"superfile-query", "superfile-cache"} <= set(console_scripts())


# --- environment variables: each one its service reads ---------------------------------------------------------


def _env_by_component() -> dict[str, set[str]]:
    env: dict[str, set[str]] = {}
    for name in ALL:
        for pod in _project_pods(name):
            env.setdefault(pod.component, set()).update(iter_env(pod.containers[0]))
    return env


ENV = _env_by_component()


@pytest.mark.parametrize("comp", sorted(ENV))
def test_every_environment_variable_is_read_by_its_service(comp: str) -> None:
    """Each variable a container gets occurs in the code that runs there: the service's package, the engine,
    botocore (the AWS_* settings) and, for the ingest job, Spark's Python and launcher scripts."""
    unread = sorted(n for n in ENV[comp] if not reads_env(comp, n))
    assert not unread, f"{comp}: set but never read: {unread}"


@pytest.mark.parametrize("var", sorted(READ_PATH_GATEWAY_ENV))
def test_the_gateway_reads_the_read_path_variables(var: str) -> None:
    assert var in ENV["gateway"]
    assert reads_env("gateway", var)
    source = (ROOT / "services/gateway/superfile_gateway/settings.py").read_text()
    assert f'"{var}"' in source, f"the gateway's settings do not read {var}"


def test_the_gateway_gets_every_limit_it_has() -> None:
    """The chart sets each of the gateway's SUPERFILE_* limits (Settings.from_env) explicitly."""
    source = (ROOT / "services/gateway/superfile_gateway/settings.py").read_text()
    pattern = r'"(SUPERFILE_(?:SQL_\w+|\w*MAX_CONCURRENT\w*|MAX_RESULT_ROWS|DRAIN_S))"'
    limits = set(re.findall(pattern, source))
    assert limits >= {"SUPERFILE_SQL_TIMEOUT_S", "SUPERFILE_MAX_CONCURRENT_PER_KEY", "SUPERFILE_DRAIN_S"}
    missing = sorted(limits - set(iter_env(_container("default", "gateway"))))
    assert not missing, (
        f"the gateway has limits the chart does not set: {missing} (charts/supertable: values.yaml, "
        "values.schema.json, templates/configmap.yaml and gateway.yaml; compose.yaml too)"
    )


# --- Services, PDBs, HPAs, the cache membership, network policies ---------------------------------------------


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


@pytest.mark.parametrize("name", ALL)
def test_every_service_pdb_and_hpa_has_its_target(name: str) -> None:
    docs = render(name)
    all_pods = pods(docs)
    for svc in by_kind(docs, "Service"):
        chosen = [p for p in all_pods if _selects(svc["spec"]["selector"], p.labels)]
        assert chosen, f"Service {svc['metadata']['name']} selects no pod"
        for port in svc["spec"]["ports"]:
            for p in chosen:
                named = {cp["name"] for c in p.containers for cp in c.get("ports", [])}
                assert port["targetPort"] in named, (svc["metadata"]["name"], port)
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        (target,) = [p for p in all_pods if _selects(pdb["spec"]["selector"]["matchLabels"], p.labels)]
        replicas = target.workload["spec"].get("replicas")
        hpa = [h for h in by_kind(docs, "HorizontalPodAutoscaler") if component(h) == target.component]
        least = hpa[0]["spec"]["minReplicas"] if hpa else replicas
        if "minAvailable" in pdb["spec"]:  # a drain must be able to proceed: one pod may always go
            assert pdb["spec"]["minAvailable"] < least, pdb["metadata"]["name"]
        else:
            assert 1 <= pdb["spec"]["maxUnavailable"] < max(least, 2), pdb["metadata"]["name"]
    for hpa in by_kind(docs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        targets = [d for d in docs if (d["apiVersion"], d["kind"], d["metadata"]["name"]) == tuple(ref.values())]
        assert len(targets) == 1, ref
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
        assert "replicas" not in targets[0]["spec"], "the HPA owns the replica count"
    for sm in by_kind(docs, "ServiceMonitor"):
        svcs = [
            s
            for s in by_kind(docs, "Service")
            if _selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        ]
        assert len(svcs) == 1, sm["metadata"]["name"]
        assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svcs[0]["spec"]["ports"]}


@pytest.mark.parametrize("name", ["default", "dev", "production"])
def test_the_query_tier_finds_the_cache_nodes_through_the_headless_service(name: str) -> None:
    docs = render(name)
    cache = _workload(docs, "StatefulSet", "cache")
    (headless,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == cache["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    assert _selects(headless["spec"]["selector"], cache["spec"]["template"]["metadata"]["labels"])
    query = _workload(docs, "Deployment", "query")["spec"]["template"]["spec"]["containers"][0]
    (dns,) = [a.split("=", 1)[1] for a in query["args"] if a.startswith("--cache-dns=")]
    host, port = dns.rsplit(":", 1)
    assert host == f"{headless['metadata']['name']}.search.svc"
    cache_port = cache["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert int(port) == cache_port == headless["spec"]["ports"][0]["port"]
    assert cache["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] in {
        m["name"] for m in cache["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    # the gateway sends reads to the query Service, on the query pods' port
    gateway = _workload(docs, "Deployment", "gateway")["spec"]["template"]["spec"]["containers"][0]
    url = _env_value(gateway, docs, "SUPERFILE_QUERY_URL")
    (svc,) = [s for s in by_kind(docs, "Service") if component(s) == "query"]
    assert url == f"http://{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}"
    assert svc["spec"]["ports"][0]["port"] == query["ports"][0]["containerPort"]
    # every tier that speaks to another one shares the internal token
    token = {
        (c["valueFrom"]["secretKeyRef"]["name"], c["valueFrom"]["secretKeyRef"]["key"])
        for comp in ("gateway", "query", "cache")
        for c in _container(name, comp)["env"]
        if c["name"] == "SUPERFILE_INTERNAL_TOKEN"
    }
    assert len(token) == 1


def test_reads_stay_in_the_gateway_without_the_query_tier() -> None:
    docs = render("reads-embedded")
    assert not {component(d) for d in docs if COMPONENT_LABEL in d["metadata"]["labels"]} & {"query", "cache"}
    assert not READ_PATH_GATEWAY_ENV & set(iter_env(_container("reads-embedded", "gateway")))
    out = run_helm(*template_args([], ["cache.enabled=false"]))
    assert out.returncode != 0 and "query.enabled needs cache.enabled" in out.stderr


def _edges(docs: tuple[dict[str, Any], ...]) -> tuple[set[tuple[str, str, str]], set[str]]:
    """(from component, to component, port) allowed by the NetworkPolicies, and the components they cover."""
    edges, covered = set(), set()
    for pol in by_kind(docs, "NetworkPolicy"):
        to = pol["spec"]["podSelector"]["matchLabels"][COMPONENT_LABEL]
        covered.add(to)
        assert pol["spec"]["policyTypes"] == ["Ingress"]
        for rule in pol["spec"]["ingress"]:
            for peer in rule["from"]:
                source = peer.get("podSelector", {}).get("matchLabels", {}).get(COMPONENT_LABEL)
                if source is None:
                    source = "metrics:" + json.dumps(peer, sort_keys=True)
                else:
                    assert "namespaceSelector" not in peer
                for port in rule["ports"]:
                    edges.add((source, to, port["port"]))
    return edges, covered


def test_network_policies_allow_exactly_the_edges_of_the_architecture() -> None:
    edges, covered = _edges(render("default"))
    assert covered == {"query", "cache", "builder"}
    assert edges == {("gateway", "query", "http"), ("query", "cache", "http")}
    edges, covered = _edges(render("dev"))
    users = {"gateway", "query", "cache", "builder", "ingest", "kafka", "s3-init"}
    assert edges == {("gateway", "query", "http"), ("query", "cache", "http"), ("builder", "redis", "redis")} | {
        (c, "kafka", "kafka") for c in ("gateway", "builder", "ingest")
    } | {(c, "s3", "s3") for c in users}
    edges, _ = _edges(render("production"))
    scrape = {e for e in edges if e[0].startswith("metrics:")}
    assert {(to, port) for _, to, port in scrape} == {("query", "http"), ("cache", "http"), ("builder", "metrics")}
    assert edges - scrape == {("gateway", "query", "http"), ("query", "cache", "http")}
    # the named ports are the pods' own
    docs = render("dev")
    for pol in by_kind(docs, "NetworkPolicy"):
        (pod,) = [p for p in pods(docs) if _selects(pol["spec"]["podSelector"]["matchLabels"], p.labels)]
        named = {p["name"] for c in pod.containers for p in c.get("ports", [])}
        assert {p["port"] for r in pol["spec"]["ingress"] for p in r["ports"]} <= named


# --- sizes that must agree with each other ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "dev", "production"])
def test_budgets_fit_in_what_the_pods_get(name: str) -> None:
    docs = render(name)
    gateway = _container(name, "gateway")
    sql = int(_env_value(gateway, docs, "SUPERFILE_SQL_MEMORY_BYTES"))
    limit = _quantity(gateway["resources"]["limits"]["memory"])
    assert sql + 512 * (1 << 20) <= limit, "the SQL workers' budget leaves the gateway process no room"
    assert gateway["resources"]["requests"]["memory"] == gateway["resources"]["limits"]["memory"]
    g = _workload(docs, "Deployment", "gateway")["spec"]["template"]["spec"]
    (cache_vol,) = [v for v in g["volumes"] if v["name"] == "cache"]
    assert int(_env_value(gateway, docs, "SUPERFILE_CACHE_BUDGET_BYTES")) <= _quantity(
        cache_vol["emptyDir"]["sizeLimit"]
    )
    drain = float(_env_value(gateway, docs, "SUPERFILE_DRAIN_S"))
    assert g["terminationGracePeriodSeconds"] > drain + 5, "SIGKILL would cut the drain short"
    cache = _workload(docs, "StatefulSet", "cache")
    args = dict(a.split("=", 1) for a in cache["spec"]["template"]["spec"]["containers"][0]["args"])
    disk = _quantity(cache["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"])
    assert int(args["--disk-budget-bytes"]) <= 0.9 * disk, "the cache volume needs room beyond its budget"
    memory = _quantity(cache["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"])
    assert int(args["--memory-budget-bytes"]) <= memory / 2
    builder = _workload(docs, "Deployment", "builder")["spec"]["template"]["spec"]
    bargs = dict(a.split("=", 1) for a in builder["containers"][0]["args"])
    (bvol,) = [v for v in builder["volumes"] if v["name"] == "cache"]
    assert int(bargs["--cache-budget-bytes"]) <= _quantity(bvol["emptyDir"]["sizeLimit"])
    assert builder["terminationGracePeriodSeconds"] * 1000 > int(bargs["--lease-ms"])


# --- values.schema.json refuses bad values ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["--set-string", "gateway.port=eighty"], "/gateway/port"),
        (["--set", "gateway.settings.sqlWorkers=true"], "/gateway/settings/sqlWorkers"),
        (["--set", "cache.replicas=-1"], "/cache/replicas"),
        (["--set", "builder.replicas=-2"], "/builder/replicas"),
        (["--set", "replicas=3"], "additional properties 'replicas' not allowed"),
        (["--set", "gateway.replica=3"], "additional properties 'replica' not allowed"),
        (["--set", "image.tag=latest"], "/image/tag"),
        (["--set", "gateway.antiAffinity=sometimes"], "/gateway/antiAffinity"),
        (["--set", "storage.uri=bucket/tables"], "/storage/uri"),
    ],
)
def test_the_values_schema_refuses(sets: list[str], message: str) -> None:
    out = run_helm("template", "st", str(CHART), *sets)
    assert out.returncode != 0, f"{sets} rendered"
    assert "values don't meet the specifications of the schema" in out.stderr, out.stderr
    assert message in out.stderr, out.stderr


# --- Dockerfiles, read statically (no container engine here: they are not built) ----------------------------------

DOCKERFILES = sorted(ROOT.glob("services/*/Dockerfile"))
BUILD_TOOLS = re.compile(r"\b(build-essential|gcc|g\+\+|clang|make|cmake|git|cargo|rustc|[\w.-]+-dev)\b|pip3? install")


def _dockerignored(path: str) -> bool:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = path.split("/")
    return any(fnmatch.fnmatch("/".join(parts[:n]), p) for p in patterns for n in range(1, len(parts) + 1))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_is_multi_stage_unprivileged_and_healthchecked(dockerfile: Any) -> None:
    service = dockerfile.parent.name
    stages = parse_dockerfile(dockerfile.read_text())
    assert len(stages) >= 2, "multi-stage: build, then a final stage without the tools"
    assert re.search(r"\bAS build\b", stages[0][0].value), "the first stage is the build stage"
    header = dockerfile.read_text().split("FROM", 1)[0]
    base = re.search(r"ARG PYTHON_IMAGE=(\S+)", header)
    assert base and re.fullmatch(r"python:3\.11-slim-\w+", base.group(1)), "a pinned Python 3.11 base"
    for stage in stages:
        for ins in stage:
            if ins.keyword == "COPY" and "--from=" not in ins.value and ins.heredoc is None:
                *sources, _dest = [w for w in ins.value.split() if not w.startswith("--")]
                for src in sources:
                    assert (ROOT / src).exists(), f"COPY {src}: no such path at the repository root"
                    assert not _dockerignored(src), f"COPY {src}: excluded by .dockerignore"
    final = stages[-1]
    keywords = [i.keyword for i in final]
    users = [i.value for i in final if i.keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the final stage runs as a non-root user"
    uid = int(users[-1].split(":")[0])
    (healthcheck,) = [i.value for i in final if i.keyword == "HEALTHCHECK"]
    assert "NONE" not in healthcheck and "CMD" in healthcheck
    labels = " ".join(i.value for i in final if i.keyword == "LABEL")
    for key in ("title", "description", "version", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, f"LABEL org.opencontainers.image.{key}"
    for ins in final:
        if ins.keyword == "RUN":
            assert not BUILD_TOOLS.search(ins.value), f"build tools in the final stage: {ins.value}"
        if ins.keyword == "COPY" and ins.heredoc is None:
            assert "--from=build" in ins.value, f"the final stage copies only the build's output: {ins.value}"
    assert "ENTRYPOINT" in keywords or "CMD" in keywords
    # the image and the chart agree: its user is the pods' runAsUser, its health check and port the chart's
    pod = next(p for name in ALL for p in _project_pods(name) if p.component == service)
    assert pod.spec["securityContext"]["runAsUser"] == uid
    ports = {p["containerPort"] for p in pod.containers[0]["ports"]}
    exposed = {int(p) for i in final if i.keyword == "EXPOSE" for p in i.value.split()}
    assert exposed == ports
    assert re.search(rf"127\.0\.0\.1:{ports.pop()}/", healthcheck)
    if service != "ingest":  # the engine's IVF scan keeps its compiled code on a volume the pod can write
        cache = re.search(r"NUMBA_CACHE_DIR=(\S+)", " ".join(i.value for i in final if i.keyword == "ENV"))
        mounts = [m["mountPath"].rstrip("/") + "/" for m in pod.containers[0]["volumeMounts"]]
        assert cache and any(cache.group(1).startswith(m) for m in mounts), "NUMBA_CACHE_DIR on a writable volume"
    # what the image runs by itself is a project program (compose.yaml relies on it)
    program = [exec_form(i.value) for i in final if i.keyword in ("ENTRYPOINT", "CMD")]
    if service == "ingest":
        (entry,) = program
        (script,) = [i.heredoc for i in final if i.heredoc]
        assert entry == ["/usr/local/bin/superfile-ingest-entrypoint"]
        assert "exec python -m superfile_ingest.example" in script
        assert "KubernetesExecutorBackend" in script and "spark-submit" in script
        venv = re.search(r"SPARK_HOME=(\S+)", " ".join(i.value for i in final if i.keyword == "ENV"))
        assert venv and venv.group(1) == "/opt/venv/lib/python3.11/site-packages/pyspark"
    else:
        argv = program[-1]
        head, _ = split_program(argv)
        assert head.argv[0] in console_scripts() or project_module_file(head.argv[-1]), argv


def test_every_project_image_has_a_dockerfile() -> None:
    for name in ALL:
        for pod in _project_pods(name):
            repo = pod.containers[0]["image"].rsplit(":", 1)[0]
            assert repo == f"supertable/{pod.component}", repo
    missing = sorted(c for c in PROJECT_COMPONENTS if not (ROOT / "services" / c / "Dockerfile").exists())
    assert not missing, f"images without a Dockerfile: {missing}"
    assert {p.parent.name for p in DOCKERFILES} == set(PROJECT_COMPONENTS)


# --- compose.yaml and the chart describe the same suite --------------------------------------------------------------

# compose-only services and what stands for them in the chart
COMPOSE_ONLY = {"prometheus": "serviceMonitor.enabled", "grafana": "dashboard (ConfigMap for Grafana's sidecar)"}
COMPOSE_TO_CHART = {"s3": "s3", "s3-init": "s3-init", "kafka": "kafka", "redis": "redis"}


def _chart_suite() -> dict[str, dict[str, Any]]:
    """Each chart component as compose sees a service: image, ports it listens on, environment names."""
    suite: dict[str, dict[str, Any]] = {}
    for pod in pods(render("dev-ingest")):
        c = pod.containers[0]
        suite[pod.component] = {
            "image": c["image"],
            "ports": {p["containerPort"] for p in c.get("ports", [])},
            "env": set(iter_env(c)),
            "flags": flags(_argv(c)),
        }
    return suite


def _compose_services() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """compose.yaml's services by chart component, each with its (name, service) copies: numbered copies
    (cache-1, cache-2, ...) are copies of one component."""
    found: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, svc in sorted(compose_config()["services"].items()):
        found.setdefault(re.sub(r"^(query|cache)-?\d+$", r"\1", name), []).append((name, svc))
    return found


def _command_values(svc: dict[str, Any]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in svc.get("command") or [] if a.startswith("--") and "=" in a)


def test_compose_and_the_chart_run_the_same_services() -> None:
    assert set(_compose_services()) - set(COMPOSE_ONLY) == set(_chart_suite())


@pytest.mark.parametrize("service", ["gateway", "builder", "ingest", "query", "cache", "redis", "kafka", "s3"])
def test_compose_and_the_chart_agree_on_images_ports_and_environment(service: str) -> None:
    chart = _chart_suite()[service]
    for name, compose in _compose_services()[service]:
        assert compose["image"] == chart["image"], name
        listens = {int(p["target"]) for p in compose.get("ports", [])} | {int(p) for p in compose.get("expose", [])}
        assert listens == chart["ports"], name
        if service in PROJECT_COMPONENTS:
            assert set(compose.get("environment", {})) == chart["env"], name
            assert compose["build"]["dockerfile"] == f"services/{service}/Dockerfile", name
            # compose passes a subset of the chart's flags to the same program (the chart states every default);
            # the query tier lists its cache nodes in compose where the chart names the headless Service
            alternatives = {"--cache-nodes"} if service == "query" else set()
            assert flags(compose.get("command") or []) <= chart["flags"] | alternatives, name


def test_compose_runs_the_read_path() -> None:
    """Three cache nodes, each with a volume of its own at its cache directory; two query roots listing exactly
    those nodes; the gateway sending reads to the query service; one internal token for the three tiers;
    Prometheus scraping each query root and cache node."""
    services = _compose_services()
    caches = services["cache"]
    assert [name for name, _ in caches] == ["cache-1", "cache-2", "cache-3"]
    volumes = set()
    for name, svc in caches:
        args = _command_values(svc)
        assert args["--host"] == "0.0.0.0" and int(args["--port"]) == int(svc["expose"][0]), name
        (mount,) = [v for v in svc["volumes"] if v["target"] == args["--cache-dir"]]
        assert mount["type"] == "volume", name
        volumes.add(mount["source"])
        same = {k: v for k, v in svc.items() if k != "volumes"}
        assert same == {k: v for k, v in caches[0][1].items() if k != "volumes"}, f"{name} differs from cache-1"
    assert len(volumes) == len(caches), "each cache node keeps its superfiles on a volume of its own"
    (query_name, query), *more = services["query"]
    assert not more and query.get("deploy", {}).get("replicas") == 2, "two query roots (replicas of one service)"
    qargs = _command_values(query)
    assert qargs["--host"] == "0.0.0.0"
    nodes = qargs["--cache-nodes"].split(",")
    assert nodes == [f"http://{name}:{_command_values(svc)['--port']}" for name, svc in caches]
    assert set(query["depends_on"]) == {name for name, _ in caches}
    ((_, gateway),) = services["gateway"]
    assert gateway["environment"]["SUPERFILE_QUERY_URL"] == f"http://{query_name}:{qargs['--port']}"
    assert "query" in gateway["depends_on"]
    tokens = {
        svc["environment"]["SUPERFILE_INTERNAL_TOKEN"] for c in ("gateway", "query", "cache") for _, svc in services[c]
    }
    assert tokens == {"t"}  # compose_config's value: one variable, required (${SUPERFILE_INTERNAL_TOKEN:?...})
    scrape = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())["scrape_configs"]
    static = {t for job in scrape for c in job.get("static_configs", []) for t in c["targets"]}
    dns = {(n, c["port"]) for job in scrape for c in job.get("dns_sd_configs", []) for n in c["names"]}
    assert {f"{name}:{_command_values(svc)['--port']}" for name, svc in caches} <= static
    assert (query_name, int(qargs["--port"])) in dns


def test_compose_keeps_redis_persistent() -> None:
    """Redis keeps leases and fences across a restart in compose (append-only file on a volume), as in the chart."""
    command = compose_config()["services"]["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    redis = _container("dev", "redis")
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"


def test_dev_dependencies_are_the_only_third_party_containers() -> None:
    for name in ALL:
        for pod in pods(render(name)):
            assert pod.component in (*PROJECT_COMPONENTS, *DEV_COMPONENTS), pod.component
            if pod.component in DEV_COMPONENTS:
                assert name in ("dev", "dev-ingest", "ingest-job-k8s"), f"{pod.component} outside the dev profile"
