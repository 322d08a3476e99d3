import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from service.settings import DEFAULT_ARTIFACTS_DIR, Settings

REPO = Path(__file__).resolve().parents[2]


def test_env_parsing(tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVE_ARTIFACTS_DIR", str(tiny_artifacts))
    monkeypatch.setenv("SERVE_MODELS", "classifier, generator")
    monkeypatch.setenv("SERVE_MAX_BATCH_SIZE", "8")
    monkeypatch.setenv("SERVE_API_KEY", "s3cr3t-key")
    monkeypatch.setenv("SERVE_LOG_LEVEL", "DEBUG")
    s = Settings()
    assert s.models == ["classifier", "generator"] and s.max_batch_size == 8 and s.log_level == "debug"
    assert s.api_key is not None and s.api_key.get_secret_value() == "s3cr3t-key"
    assert "s3cr3t" not in repr(s)  # the key is not logged


def test_an_empty_variable_is_unset(tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As an env file's `SERVE_SPIN_BETWEEN_RUNS=` leaves it: the default, not a parse error."""
    monkeypatch.setenv("SERVE_ARTIFACTS_DIR", str(tiny_artifacts))
    for name in ("SPIN_BETWEEN_RUNS", "IO_BINDING", "MAX_BATCH_SIZE", "API_KEY", "MODELS"):
        monkeypatch.setenv(f"SERVE_{name}", "")
    s = Settings()
    assert s.spin_between_runs is None and s.io_binding is None and s.api_key is None
    assert s.max_batch_size == Settings.model_fields["max_batch_size"].default and s.models


def test_default_artifacts_dir_is_the_repo_folder() -> None:
    assert DEFAULT_ARTIFACTS_DIR == REPO / "artifacts"


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"models": "translator,unknown"}, r"no artifact for \['unknown'\]"),
        ({"models": "translator,../generator"}, "invalid model name"),
        ({"artifacts_dir": Path("/nonexistent")}, "no model folder"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"device": "tpu"}, "device"),
        ({"quantization": "int4"}, "quantization"),
        ({"request_timeout_s": 0}, "request_timeout_s"),
        ({"port": 70000}, "port"),
    ],
)
def test_invalid_settings_fail_fast(tiny_artifacts: Path, overrides: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        Settings(**({"artifacts_dir": tiny_artifacts} | overrides))


def test_missing_model_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"no artifact for \['generator'\].*SERVE_MODELS"):
        Settings(artifacts_dir=tmp_path, models=["generator"])


def test_python_m_service_reports_bad_settings(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    env |= {"SERVE_ARTIFACTS_DIR": str(tmp_path), "SERVE_MAX_QUEUE_SIZE": "-1"}
    proc = subprocess.run(
        [sys.executable, "-m", "service"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "invalid settings" in proc.stderr and "SERVE_MAX_QUEUE_SIZE" in proc.stderr
