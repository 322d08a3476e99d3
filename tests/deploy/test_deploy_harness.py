"""The container end-to-end run's configuration (harness/deploy/compose.py), no Docker needed: any engine,
the ports of DEPLOY_API_PORT, DEPLOY_LB_PORT and DEPLOY_REPLICA_PORTS, nothing that needs ../shared."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.deploy.compose import NGINX_PORT, host_network, nginx_conf, ports

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["harness/deploy/run.sh", "harness/reliability/container.sh"]


def compose_files() -> dict[str, Any]:
    """docker-compose.yml with the CI override's services laid over it (what `config` merges, roughly)."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    override = yaml.safe_load((ROOT / "harness" / "deploy" / "docker-compose.ci.yml").read_text())
    for name, service in override["services"].items():
        doc["services"][name] = {**doc["services"][name], **service}
    doc.pop("x-server", None)
    return doc


def upstreams(conf: str) -> list[str]:
    return re.findall(r"^\s*server (\S+) [^{\n]*;$", conf, re.MULTILINE)


def test_nginx_follows_the_ports_chosen() -> None:
    one = nginx_conf({"api": 9000}, 9080)
    assert "listen 9080;" in one and upstreams(one) == ["api:9000", "replica:9000"]  # `replica`: the api again
    three = nginx_conf({"api": 8000, "replica": 8001, "replica-2": 8002}, 8080)
    assert upstreams(three) == ["api:8000", "replica:8001", "replica:8002"] and "listen 8080;" in three
    assert three.replace("8001", "8000").count("max_fails") == 3  # nothing else changed


def test_every_server_listens_on_its_port_on_the_host_network(tmp_path: Path) -> None:
    servers = {"api": 9000, "replica": 9001, "replica-2": 9002}
    doc = host_network(compose_files(), servers, tmp_path / "nginx.conf")
    services = doc["services"]
    assert all(s["network_mode"] == "host" and "ports" not in s for s in services.values())
    for name, port in servers.items():
        assert services[name]["environment"]["SERVE_PORT"] == str(port) and services[name]["deploy"]["replicas"] == 1
    assert "build" not in services["replica-2"] and services["api"]["build"]["network"] == "host"
    lb = services["lb"]
    assert lb["volumes"] == [f"{tmp_path / 'nginx.conf'}:/etc/nginx/nginx.conf:ro"]
    # The mounted file has the ports: the command's rewrite of :8000 must leave it as it is.
    assert lb["environment"]["SERVE_PORT"] == str(NGINX_PORT) and "SERVE_PORT" in lb["command"][-1]


def test_ports_are_settable_and_distinct(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (ports().api, ports().lb, ports().replicas) == (8000, 8080, (8001, 8002))
    monkeypatch.setenv("DEPLOY_API_PORT", "18000")
    monkeypatch.setenv("DEPLOY_REPLICA_PORTS", "18001,18002")
    monkeypatch.setenv("DEPLOY_LB_PORT", "18080")
    assert (ports().api, ports().lb, ports().replicas) == (18000, 18080, (18001, 18002))
    monkeypatch.setenv("DEPLOY_LB_PORT", "18000")
    with pytest.raises(SystemExit, match="distinct"):
        ports()


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_scripts_parse_and_name_no_fixed_engine_or_port(script: str) -> None:
    """`bash -n`; no port, client path or docker-sandbox compose beyond the defaults run.sh states."""
    assert subprocess.run(["bash", "-n", script], cwd=ROOT).returncode == 0
    text = (ROOT / script).read_text()
    assert "sandbox\" compose" not in text and "$SANDBOX compose" not in text
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    fixed = re.findall(r"127\.0\.0\.1:\d+|:80[0-9]0\b", code)
    assert not fixed, fixed
    if script.endswith("run.sh"):
        assert 'if "$DOCKER" info' in code and "DEPLOY_API_PORT:-8000" in code and "DEPLOY_LB_PORT:-8080" in code
