"""Docker Compose for the container end-to-end run (harness/deploy/run.sh), on any Docker engine: the
project's docker-compose.yml with harness/deploy/docker-compose.ci.yml, rendered for host networking with
the ports the run chose. Standard library and PyYAML.

    python harness/deploy/compose.py -p tsdeploy [--profile scale] COMMAND [ARGS]

renders the configuration (`config` of the Compose CLI, with the shell's variables as they are now), writes
it and the nginx configuration to /tmp/<project>-deploy/, and runs COMMAND on it.

Host networking: the engine docker-sandbox starts has no bridge network, and every Linux engine has host
networking, so one configuration serves both and every test request stays on 127.0.0.1. Published `ports`
go (Compose v1 refuses them beside host networking); each server listens on its own port instead
(SERVE_PORT), and nginx gets deploy/nginx.conf with its `listen` and upstream ports rewritten.

Environment: DEPLOY_API_PORT (8000, `api`), DEPLOY_LB_PORT (8080, nginx), DEPLOY_REPLICA_PORTS ("8001,8002",
the `scale` profile's two replicas in harness/deploy/scale.py); DEPLOY_COMPOSE, the Compose CLI ("docker
compose" or "docker-compose"; unset: the first of them that answers).
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = ("docker-compose.yml", "harness/deploy/docker-compose.ci.yml")
NGINX_PORT = 8000  # the upstream port in deploy/nginx.conf (the servers' default SERVE_PORT)


@dataclass(frozen=True)
class Ports:
    api: int
    lb: int
    replicas: tuple[int, ...]


def ports() -> Ports:
    """The run's ports, from the environment (defaults: the server's and nginx's own)."""
    replicas = tuple(int(p) for p in os.environ.get("DEPLOY_REPLICA_PORTS", "8001,8002").split(",") if p.strip())
    api, lb = int(os.environ.get("DEPLOY_API_PORT", "8000")), int(os.environ.get("DEPLOY_LB_PORT", "8080"))
    found = Ports(api, lb, replicas)
    every = [found.api, found.lb, *found.replicas]
    if len(set(every)) != len(every) or not all(0 < p < 65536 for p in every):
        raise SystemExit(f"DEPLOY_API_PORT, DEPLOY_LB_PORT and DEPLOY_REPLICA_PORTS must be distinct ports: {every}")
    return found


def compose_cli() -> list[str]:
    """The Compose CLI: DEPLOY_COMPOSE, else Compose v2 (`docker compose`), else v1 (`docker-compose`)."""
    if chosen := os.environ.get("DEPLOY_COMPOSE"):
        return shlex.split(chosen)
    docker = os.environ.get("DOCKER", "docker")
    if subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    return ["docker-compose"]


def nginx_conf(servers: dict[str, int], lb_port: int) -> str:
    """deploy/nginx.conf listening on `lb_port`, its `api` upstream on servers["api"] and its `replica`
    upstream line spread over every other server's port (none: the one `api` again, as a replica)."""
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    listen = re.search(r"^(\s*)listen 8080;$", conf, re.MULTILINE)
    api = re.search(rf"^(\s*)server api:{NGINX_PORT}( [^;]*);$", conf, re.MULTILINE)
    replica = re.search(rf"^(\s*)server replica:{NGINX_PORT}( [^;]*);$", conf, re.MULTILINE)
    assert listen and api and replica, "deploy/nginx.conf lost its `listen 8080`, `server api:8000` or replica line"
    others = [port for name, port in servers.items() if name != "api"] or [servers["api"]]
    indent, options = replica.groups()
    edits = [
        (listen, f"{listen.group(1)}listen {lb_port};"),
        (api, f"{api.group(1)}server api:{servers['api']}{api.group(2)};"),
        (replica, "\n".join(f"{indent}server replica:{port}{options};" for port in others)),
    ]
    for match, text in sorted(edits, key=lambda e: e[0].start(), reverse=True):
        conf = conf[: match.start()] + text + conf[match.end() :]
    return conf


def host_network(doc: dict[str, Any], servers: dict[str, int], nginx_path: Path) -> dict[str, Any]:
    """The rendered configuration on the host network: `servers` (service name -> port; a name the file
    lacks is another copy of `replica`) listen on their ports, nginx reads `nginx_path`."""
    doc = copy.deepcopy(doc)
    services: dict[str, Any] = doc["services"]
    for name in servers:
        if name not in services:
            services[name] = copy.deepcopy(services["replica"])
            services[name].pop("build", None)  # the same image as `replica`
    for name, service in services.items():
        service.pop("ports", None)
        service.pop("networks", None)
        service["network_mode"] = "host"
        if isinstance(service.get("build"), dict):
            service["build"]["network"] = "host"  # RUN steps reach the package index
        env = service.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.partition("=")[::2] for item in env)
        service["environment"] = {k: v for k, v in env.items() if v is not None}
        if name in servers:
            service["environment"]["SERVE_PORT"] = str(servers[name])
            service.setdefault("deploy", {})["replicas"] = 1
    if "lb" in services:
        services["lb"]["volumes"] = [f"{nginx_path}:/etc/nginx/nginx.conf:ro"]
        # The mounted file has the servers' ports already: the command's SERVE_PORT rewrite leaves it as is.
        services["lb"]["environment"]["SERVE_PORT"] = str(NGINX_PORT)
    doc.pop("networks", None)
    return doc


def rendered(profiles: list[str]) -> dict[str, Any]:
    """`config` of docker-compose.yml + the CI override, as the Compose CLI resolves it now."""
    args = [arg for f in FILES for arg in ("-f", f)] + [arg for p in profiles for arg in ("--profile", p)]
    out = subprocess.run([*compose_cli(), *args, "config"], cwd=ROOT, check=True, capture_output=True, text=True)
    doc: dict[str, Any] = yaml.safe_load(out.stdout)
    return doc


def write(project: str, doc: dict[str, Any], servers: dict[str, int], lb_port: int) -> Path:
    """Write the nginx configuration and the host-network compose file under /tmp/<project>-deploy/."""
    folder = Path("/tmp") / f"{project}-deploy"
    folder.mkdir(parents=True, exist_ok=True)
    nginx_path = folder / "nginx.conf"
    nginx_path.write_text(nginx_conf(servers, lb_port))
    nginx_path.chmod(0o644)  # read by the container's own user
    compose_file = folder / "compose.yml"
    compose_file.write_text(yaml.safe_dump(host_network(doc, servers, nginx_path), sort_keys=False))
    return compose_file


def command(project: str, compose_file: Path, profiles: list[str], args: list[str]) -> list[str]:
    flags = [arg for p in profiles for arg in ("--profile", p)]
    return [*compose_cli(), "-f", str(compose_file), "-p", project, "--project-directory", str(ROOT), *flags, *args]


def main(argv: list[str]) -> int:
    project, profiles = "tsdeploy", []
    while argv and argv[0] in ("-p", "--project-name", "--profile"):
        flag, value, argv = argv[0], argv[1], argv[2:]
        if flag == "--profile":
            profiles.append(value)
        else:
            project = value
    chosen = ports()
    servers = {"api": chosen.api}
    compose_file = write(project, rendered(profiles), servers, chosen.lb)
    return subprocess.run(command(project, compose_file, profiles, argv), cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
