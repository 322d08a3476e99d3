"""Static checks of the deployment files, no Docker needed: they keep Dockerfile, docker-compose*.yml,
.env.example and the settings table of docs/operations.md in step with service/settings.py, and the
README's and docs/ pages' links pointing at files that exist. harness/deploy/run.sh tests the real container."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts import readme_models
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
# Fixed by the image (Dockerfile ENV); docker-compose.yml does not pass them through.
IMAGE_FIXED = {"host", "artifacts_dir"}
# What a model of each task is called in the deployment files' summaries.
TASK_NOUNS = {"translation": "translator", "generation": "generator", "classification": "classifier",
              "embedding": "embedder"}  # fmt: skip


def env_name(field: str) -> str:
    return f"SERVE_{field.upper()}"


def load_yaml(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / name).read_text())
    return doc


def env_example() -> dict[str, str]:
    """`# NAME=value` and `NAME=value` lines of .env.example."""
    pairs = re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=(.*)$", (ROOT / ".env.example").read_text(), re.MULTILINE)
    return dict(pairs)


def rendered_default(field: str) -> str:
    default = Settings.model_fields[field].get_default(call_default_factory=True)
    if default is None:
        return ""
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, list):
        return ",".join(default)
    return str(default)


def compose_seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", value))


def test_every_setting_is_documented_in_env_example_and_docs() -> None:
    example = env_example()
    settings_table = (ROOT / "docs" / "operations.md").read_text().split("## Settings", 1)[1]
    for field in Settings.model_fields:
        name = env_name(field)
        assert name in example, f"{name} missing from .env.example"
        assert f"| `{name}` |" in settings_table, f"{name} missing from the settings table in docs/operations.md"


@pytest.mark.parametrize("field", sorted(set(Settings.model_fields) - IMAGE_FIXED))
def test_env_example_shows_the_real_default(field: str) -> None:
    assert env_example()[env_name(field)] == rendered_default(field)


def test_compose_passes_every_setting_through() -> None:
    anchor = load_yaml("docker-compose.yml")["x-server"]
    passed = set(anchor["environment"])
    expected = {env_name(f) for f in Settings.model_fields} - {env_name(f) for f in IMAGE_FIXED}
    assert passed == expected


def test_the_servers_port_is_one_setting() -> None:
    """SERVE_PORT reaches the servers, their published port, their healthcheck and nginx's upstreams."""
    services = load_yaml("docker-compose.yml")["services"]
    assert services["api"]["ports"] == ["${HOST_PORT:-8000}:${SERVE_PORT:-8000}"]
    assert "os.environ.get('SERVE_PORT', '8000')" in (ROOT / "deploy" / "healthcheck.py").read_text()
    lb = services["lb"]
    assert "SERVE_PORT" in lb["environment"] and "$${SERVE_PORT:-8000}" in lb["command"][-1]
    assert "nginx -c /tmp/nginx.conf" in lb["command"][-1]  # the root filesystem is read-only; /tmp is not
    upstreams = re.findall(r"^\s*server (\S+) [^{\n]*;$", (ROOT / "deploy" / "nginx.conf").read_text(), re.MULTILINE)
    assert upstreams and all(u.endswith(":8000") for u in upstreams), upstreams  # what the command rewrites


def test_compose_header_names_every_task_served() -> None:
    """docker-compose.yml's first line says what the image serves: a model of each task in artifacts/."""
    header = (ROOT / "docker-compose.yml").read_text().splitlines()[0]
    tasks = {yaml.safe_load(p.read_text())["task"] for p in (ROOT / "artifacts").glob("*/config.json")}
    assert tasks and all(TASK_NOUNS[t] in header for t in tasks), (header, tasks)


def test_deployment_files_cite_sections_that_exist() -> None:
    """`docs/x.md ("Heading")` in .env.example, the Dockerfile and the compose files names a real heading."""
    cited = []
    for name in (".env.example", "Dockerfile", "docker-compose.yml", "docker-compose.gpu.yml"):
        text = (ROOT / name).read_text()
        assert not re.search(r"\bREADME\b(?!\.md)|README\.md \(?\"", text), f"{name} cites a README section"
        for page, heading in re.findall(r"([\w/.-]+\.md) \(?\"([^\"]+)\"", text):
            headings = re.findall(r"^#+ (.+)$", (ROOT / page).read_text(), re.MULTILINE)
            assert heading in headings, f"{name}: {page} has no heading {heading!r}"
            cited.append(page)
    assert "docs/operations.md" in cited


def test_code_cites_docs_not_readme_sections() -> None:
    """The README is a front door: reference sections (settings, clients, generation) live in docs/, and the
    code's comments and API descriptions point there."""
    stale = []
    for package in ("service", "contract", "model", "scripts", "harness", "benchmarks"):
        for path in (ROOT / package).rglob("*.py"):
            for match in re.finditer(r'README\b(?!\.md)[ ,(]*"[A-Z]|see the README', path.read_text()):
                stale.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert not stale, stale


def test_compose_server_is_hardened_and_drains() -> None:
    compose = load_yaml("docker-compose.yml")
    api = compose["services"]["api"]
    assert api["restart"] == "unless-stopped"
    assert api["read_only"] is True and any(t.startswith("/tmp") for t in api["tmpfs"])
    assert "/ready" in api["healthcheck"]["test"]
    limits = api["deploy"]["resources"]["limits"]
    assert limits["cpus"] and limits["memory"]
    grace = compose_seconds(re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", api["stop_grace_period"]))
    drain = Settings.model_fields["drain_timeout_s"].default
    assert grace >= drain + 5, f"stop_grace_period {grace}s leaves no time to drain {drain}s"


def test_scale_profile_puts_replicas_behind_least_connections() -> None:
    services = load_yaml("docker-compose.yml")["services"]
    assert services["replica"]["profiles"] == ["scale"] and services["lb"]["profiles"] == ["scale"]
    assert "ports" not in services["replica"], "replicas must not publish a host port (they would collide)"
    assert "replicas" in services["replica"]["deploy"]
    nginx = (ROOT / "deploy" / "nginx.conf").read_text()
    assert "least_conn;" in nginx and "server api:8000" in nginx and "server replica:8000" in nginx
    assert "proxy_buffering off;" in nginx, "SSE streams must not be buffered by the proxy"


def test_gpu_override_builds_gpu_variant_and_reserves_a_gpu() -> None:
    gpu = load_yaml("docker-compose.gpu.yml")["services"]
    for name in ("api", "replica"):
        assert gpu[name]["build"]["args"]["ORT_VARIANT"] == "gpu"
        (device,) = gpu[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_dockerfile_runtime_stage() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in dockerfile
    runtime = dockerfile.split("AS runtime", 1)[1]
    user = re.search(r"^USER (\S+)", runtime, re.MULTILINE)
    assert user and user.group(1).split(":")[0] not in {"root", "0"}
    assert re.search(r"^HEALTHCHECK .*\n?.*/health", runtime, re.MULTILINE)
    assert re.search(r"^COPY (--from=int8 /src/)?artifacts /app/artifacts$", runtime, re.MULTILINE)
    assert "EXPOSE 8000" in runtime
    assert re.search(r'^CMD \["python", "-m", "service"\]', runtime, re.MULTILINE)


def test_dockerignore_keeps_data_and_checkpoints_out() -> None:
    rules = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert rules[0] == "*", "allow-list: exclude everything, then name what the image needs"
    allowed = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    assert allowed.isdisjoint({"data", "runs", ".venv", ".git", "model", "tests"})
    assert {"**/__pycache__", "**/*.pt"} <= set(rules)


def test_readme_and_docs_links_resolve() -> None:
    """Every relative link of README.md, CHANGELOG.md and docs/*.md names a file or folder of the checkout."""
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path) or path.startswith("../../shared/"):
                continue
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_readme_says_what_each_model_is_for_as_its_card_does() -> None:
    """The README's block of model uses is the cards' (python -m scripts.readme_models writes it): each
    committed model's use, training domains and out-of-scope uses."""
    readme = (ROOT / "README.md").read_text()
    expected = readme_models.render(ROOT / "artifacts")
    assert readme_models.replaced(readme, expected) == readme, "stale: run python -m scripts.readme_models"
    for card in (ROOT / "artifacts").glob("*/card.json"):
        out_of_scope = yaml.safe_load(card.read_text())["out_of_scope"]
        assert f"**{card.parent.name}**" in expected and out_of_scope[-1].split()[-1] in expected, card


def test_readme_is_a_front_door() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
