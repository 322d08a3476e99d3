"""Which package may import which: contract <- model, service; scripts, benchmarks and harness above them;
tests above all. Inside service/: api -> engine -> runtime; no torch and no model/ anywhere in it."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SERVICE = REPO / "service"
OURS = {"contract", "model", "service", "scripts", "benchmarks", "harness", "tests"}
# A package may import itself and these of ours; nothing imports tests/.
ALLOWED = {
    "contract": set(),
    "model": {"contract"},
    "service": {"contract"},
    "scripts": {"contract", "model", "service"},
    "harness": {"contract", "model", "service"},
    "benchmarks": {"contract", "model", "service", "scripts", "harness"},
}


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def modules(layer: str) -> list[Path]:
    return sorted((SERVICE / layer).rglob("*.py"))


def roots(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_run_one_way(package: str) -> None:
    wrong = {
        f"{path.relative_to(REPO)} imports {name}"
        for path in (REPO / package).rglob("*.py")
        for name in imports(path)
        if name.split(".")[0] in OURS - {package} - ALLOWED[package]
    }
    assert not wrong, sorted(wrong)


def test_no_torch_and_no_model_package_in_the_server() -> None:
    for path in SERVICE.rglob("*.py"):
        assert not roots(imports(path)) & {"torch", "model", "transformers"}, path


def test_onnx_only_where_graphs_load() -> None:
    """The onnx package (protobuf graphs) serves the runtime layer's load-time rewrite (runtime/fusion.py)."""
    for path in SERVICE.rglob("*.py"):
        if path.parent != SERVICE / "runtime":
            assert "onnx" not in roots(imports(path)), path


def test_onnx_runtime_only_in_the_runtime_layer() -> None:
    """Sessions, their options and OrtValues stay behind service/runtime/: the engine and the routes see
    numpy arrays and the runtime's own types, so the runtime is the one place that knows ONNX Runtime."""
    runtime = SERVICE / "runtime"
    outside = [
        str(path.relative_to(REPO))
        for path in SERVICE.rglob("*.py")
        if runtime not in path.parents and "onnxruntime" in roots(imports(path))
    ]
    assert not outside, outside


def test_engine_never_imports_the_web_layer() -> None:
    for path in modules("engine"):
        found = imports(path)
        assert not roots(found) & {"fastapi", "starlette", "uvicorn", "httpx"}, path
        assert not any(n.startswith(("service.api", "service.app")) for n in found), path


def test_runtime_is_the_bottom_layer() -> None:
    for path in modules("runtime"):
        found = imports(path)
        assert not any(n.startswith(("service.api", "service.engine", "service.app")) for n in found), path
        assert not roots(found) & {"fastapi", "starlette"}, path


def test_routes_never_touch_onnx_runtime() -> None:
    for path in modules("api"):
        found = imports(path)
        assert "onnxruntime" not in roots(found), path
        assert not any(n.startswith("service.runtime") for n in found), path


def _service_types_checked(source: str) -> list[str]:
    """The service types (names ending in "Service") that `isinstance` calls in `source` check, with their
    lines; a union or a tuple of types counts each member."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            types = node.args[1] if len(node.args) == 2 else ast.Constant(None)
            names = sorted({n.id for n in ast.walk(types) if isinstance(n, ast.Name) and n.id.endswith("Service")})
            found += [f"{node.lineno}: {name}" for name in names]
    return found


def test_only_the_registry_tells_services_apart() -> None:
    """The protocols ask a model's Capabilities and the task registry what it can do; only the registry
    (service/engine/registry.py) checks which service class runs a model."""
    registry = SERVICE / "engine" / "registry.py"
    found = {
        str(path.relative_to(REPO)): hits
        for path in SERVICE.rglob("*.py")
        if path != registry and (hits := _service_types_checked(path.read_text()))
    }
    assert not found, found


def test_the_service_type_check_reads_unions_and_tuples() -> None:
    source = "isinstance(s, GenerationService | ClassificationService)\nisinstance(s, (int, EmbeddingService))\n"
    source += "isinstance(s, int)\n"
    assert _service_types_checked(source) == ["1: ClassificationService", "1: GenerationService", "2: EmbeddingService"]
