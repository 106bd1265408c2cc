"""docker/: compose, Prometheus and Grafana files parse and agree with each other and with
vlmdata/metrics/registry.py; the Dockerfile installs the package the README's way (`make env`).
No container engine is needed."""
from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml

from tests.helpers.paths import REPO
from vlmdata.dashboard import CHARTS
from vlmdata.metrics import MetricSet, exported_series

pytestmark = pytest.mark.integration  # docker/ configuration, checked without a container engine

DOCKER = REPO / "docker"
EXPORTED = exported_series(MetricSet())
TARGET_LABELS = {"instance", "job"}  # added by Prometheus to every scraped series

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                "unless", "offset", "inf", "nan"}


def promql_refs(expr: str) -> tuple[set[str], set[str], set[tuple[str, str]]]:
    """(metric names, grouping labels, (metric, selector label) pairs) used by a PromQL expression."""
    expr = re.sub(r"\$\{?\w+\}?", "1m", expr)                      # Grafana variables
    selectors = set()
    for name, body in re.findall(r"([A-Za-z_:][\w:]*)\s*\{([^}]*)\}", expr):
        for label in re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", body):
            selectors.add((name, label))
    expr = re.sub(r"\{[^}]*\}", "", expr)                           # label matchers
    expr = re.sub(r'"[^"]*"', "", expr)                              # strings
    expr = re.sub(r"\[[^\]]*\]", "", expr)                           # range selectors
    grouping = set()
    for body in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        grouping |= {lab.strip() for lab in body.split(",") if lab.strip()}
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", expr):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_WORDS:
            continue
        names.add(word)
    return names, grouping, selectors


def test_promql_parser_itself():
    names, grouping, sel = promql_refs(
        'histogram_quantile(0.95, sum by (le, rank) (rate(a_bucket{tier="x", job=~"t"}[$__rate_interval]))) / b')
    assert names == {"a_bucket", "b"} and grouping == {"le", "rank"}
    assert sel == {("a_bucket", "tier"), ("a_bucket", "job")}


def check_exprs(exprs: list[str], where: str) -> set[str]:
    assert exprs, f"no queries found in {where}"
    used = set()
    for expr in exprs:
        names, grouping, selectors = promql_refs(expr)
        assert names, f"{where}: no metric in {expr!r}"
        for name in names:
            assert name in EXPORTED or name == "up", f"{where}: {name!r} is not defined in vlmdata/metrics/registry.py"
        labels = set().union(*(EXPORTED.get(n, ()) for n in names)) | TARGET_LABELS
        assert grouping <= labels, f"{where}: grouping labels {grouping - labels} not on {names}"
        for name, label in selectors:
            assert label in set(EXPORTED.get(name, ())) | TARGET_LABELS, f"{where}: {name} has no label {label!r}"
        used |= names
    return used


def load_compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def grafana_dashboard() -> dict:
    return json.loads((DOCKER / "grafana" / "dashboards" / "vlmdata.json").read_text())


def test_compose_parses_and_has_every_service():
    compose = load_compose()
    services = compose["services"]
    for name in ("s3", "cache-daemon", "trainer", "prometheus", "grafana"):
        assert name in services, f"compose has no {name} service"
    assert "minio" in services["s3"]["image"]
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, f"service {name} has neither image nor build"
        deps = svc.get("depends_on", [])
        for dep in deps:
            assert dep in services, f"{name} depends on unknown service {dep}"
        for vol in svc.get("volumes", []):
            src = vol.split(":", 1)[0]
            if src.startswith("."):
                assert (DOCKER / src).exists(), f"{name} mounts missing {src}"
            else:
                assert src in compose.get("volumes", {}), f"{name} uses undeclared volume {src}"


def test_builds_use_dockerfile_targets():
    compose = load_compose()
    text = (DOCKER / "Dockerfile").read_text()
    stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", text, re.M | re.I))
    built = {}
    for name, svc in compose["services"].items():
        if "build" in svc:
            b = svc["build"]
            assert (DOCKER / b["context"] / b["dockerfile"]).resolve() == (DOCKER / "Dockerfile").resolve()
            assert b["target"] in stages, f"{name}: no stage {b['target']} in docker/Dockerfile"
            built[svc["image"]] = b["target"]
    assert set(built.values()) == {"daemon", "trainer"}
    for name, svc in compose["services"].items():  # services reusing a built image name it exactly
        if "build" not in svc and svc["image"].startswith("vlmdata-"):
            assert svc["image"] in built, f"{name} uses image {svc['image']} that nothing builds"


def test_dockerfile_installs_the_readme_way():
    text = (DOCKER / "Dockerfile").read_text()
    readme = (REPO / "README.md").read_text()
    assert "make" in readme and "tools/setup_env.sh" in readme
    runs = " ".join(re.findall(r"^RUN\s+(.*(?:\\\n.*)*)", text, re.M))
    assert re.search(r"\bmake env\b", runs), "the image must install with `make env` (README)"
    assert not re.search(r"pip\s+install", runs), "no ad-hoc pip install: `make env` does it"
    for needed in ("Makefile", "pyproject.toml", "tools/", "vlmdata/", "vlmdata_pipelines/"):
        assert re.search(rf"^COPY\s+.*{re.escape(needed)}", text, re.M), f"Dockerfile does not copy {needed}"
    assert "/opt/vlmdata/.venv/bin" in text and "VLMDATA_METRICS_HOST=0.0.0.0" in text
    base = re.search(r"^ARG PYTHON_IMAGE=python:(\d+)\.(\d+)", text, re.M)
    assert base and (int(base.group(1)), int(base.group(2))) >= (3, 10)
    for target, program in (("daemon", "cache-daemon"), ("trainer", "torch.distributed.run")):
        stage = text.split(f"AS {target}", 1)[1].split("\nFROM ", 1)[0]
        assert program in stage
    # the build context ignores the host venv and git data (BuildKit's per-Dockerfile ignore file)
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert "**/.venv" in ignore and ".git" in ignore
    # everything the Makefile's env target needs is copied
    assert "tools/setup_env.sh" in (REPO / "Makefile").read_text()


def metrics_ports(svc: dict) -> list[int]:
    """Ports a vlmdata service serves metrics on, from its command line."""
    cmd = svc.get("command", [])
    args = cmd if isinstance(cmd, list) else shlex.split(cmd)
    port = int(args[args.index("--metrics-port") + 1])
    nproc = int(args[args.index("--nproc_per_node") + 1]) if "--nproc_per_node" in args else 1
    return [port + r for r in range(nproc)]  # rank r serves on port + r


def test_prometheus_scrapes_exactly_the_metrics_services():
    compose = load_compose()
    prom = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    mounted = [v for v in compose["services"]["prometheus"]["volumes"] if "prometheus.yml" in v]
    assert mounted and mounted[0].split(":")[1] in compose["services"]["prometheus"]["command"][0]
    scraped = {}
    for job in prom["scrape_configs"]:
        for sc in job["static_configs"]:
            for target in sc["targets"]:
                host, port = target.rsplit(":", 1)
                scraped.setdefault(host, set()).add(int(port))
    expected = {name: set(metrics_ports(svc)) for name, svc in compose["services"].items()
                if "--metrics-port" in (svc.get("command") or [])}
    assert expected == {"cache-daemon": {9400}, "trainer": {9500, 9501}}
    assert scraped == expected
    dash = compose["services"]["dashboard"]
    targets = dash["command"][dash["command"].index("--targets") + 1].split(",")
    assert {t.rsplit(":", 1)[0] for t in targets} == set(expected)
    assert {int(t.rsplit(":", 1)[1]) for t in targets} == set().union(*expected.values())


def test_s3_endpoint_and_credentials_agree():
    compose = load_compose()
    s3 = compose["services"]["s3"]
    user, password = s3["environment"]["MINIO_ROOT_USER"], s3["environment"]["MINIO_ROOT_PASSWORD"]
    for name in ("cache-daemon", "trainer", "prepare"):
        env = compose["services"][name]["environment"]
        assert env["AWS_ENDPOINT_URL"] == "http://s3:9000"
        assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (user, password)


def test_grafana_provisioning_and_dashboard_queries():
    ds = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yml").read_text())
    source = ds["datasources"][0]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/vlmdata.yml").read_text())
    path = providers["providers"][0]["options"]["path"]
    mounts = load_compose()["services"]["grafana"]["volumes"]
    assert any(v.split(":")[1] == path and (DOCKER / v.split(":")[0]).is_dir() for v in mounts)
    dash = grafana_dashboard()
    assert dash["uid"] and dash["title"]
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    exprs = []
    for p in panels:
        assert p["datasource"]["uid"] == source["uid"], p["title"]
        assert p["targets"], p["title"]
        exprs += [t["expr"] for t in p["targets"]]
    used = check_exprs(exprs, "grafana dashboard")
    jobs = {j["job_name"] for j in yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())["scrape_configs"]}
    for expr in exprs:  # job selectors name the Prometheus jobs that exist
        for value in re.findall(r'\bjob\s*=~?\s*"([^"]+)"', expr):
            assert set(value.split("|")) <= jobs, (expr, jobs)
    titles = " | ".join(p["title"].lower() for p in panels)
    for wanted in ("images / s", "tokens / s", "padding fraction", "data-wait fraction per rank",
                   "cache hit rate per tier", "object store"):
        assert wanted in titles, f"grafana dashboard lacks a {wanted!r} panel"
    # every metric vlmdata defines is on some panel
    base = {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n in EXPORTED}
    shown = {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n in used}
    assert base <= shown, f"metrics without a Grafana panel: {sorted(base - shown)}"


def test_web_dashboard_queries_defined_metrics():
    for chart in CHARTS:
        for name in chart.metric_names():
            assert name in EXPORTED, f"dashboard chart {chart.id} uses undefined {name}"
        labels = set().union(*(EXPORTED[n] for n in chart.metric_names()))
        assert chart.label_names() <= labels, f"chart {chart.id}: labels {chart.label_names() - labels}"


@pytest.mark.parametrize("bad", ["sum(rate(vlmdata_imagez_total[1m]))", 'vlmdata_cache_hits_total{rank="0"}'])
def test_checker_rejects_unknown_metrics_and_labels(bad):
    with pytest.raises(AssertionError):
        check_exprs([bad], "test")


def test_compose_commands_parse_with_the_real_command_lines():
    """Every vlmdata / pipelines command in the compose file is accepted by its argparse parser."""
    from vlmdata.cli import build_parser
    from vlmdata_pipelines.train import build_parser as train_parser

    services = load_compose()["services"]
    cli = build_parser()
    daemon = cli.parse_args(["cache-daemon", *services["cache-daemon"]["command"]])
    assert daemon.metrics_port == 9400 and json.loads(daemon.storage_options)["endpoint_url"] == "http://s3:9000"
    dash = services["dashboard"]
    assert cli.parse_args([*dash["entrypoint"][1:], *dash["command"]]).command == "dashboard"
    trainer = services["trainer"]["command"]
    assert trainer[trainer.index("-m") + 1] == "vlmdata_pipelines.train"
    train = train_parser().parse_args(trainer[trainer.index("-m") + 2:])
    assert train.metrics_port == 9500 and train.data.startswith("s3://vlmdata/")
    # the trainer reaches the daemon through the socket on the volume both mount
    assert train.cache_daemon == daemon.socket
    sock_dir = daemon.socket.rsplit("/", 1)[0]
    for name in ("cache-daemon", "trainer"):
        assert any(v.split(":")[1] == sock_dir for v in services[name]["volumes"]), name
    # the prepare job shards into the bucket the trainer reads
    steps = [shlex.split(s) for s in services["prepare"]["command"][0].split("&&")]
    shard = cli.parse_args(steps[1][1:])
    assert shard.command == "shard" and shard.output == train.data
    assert steps[0][:3] == ["python", "-m", "vlmdata_pipelines.corpus"] and shard.inputs[0].startswith(steps[0][3])
