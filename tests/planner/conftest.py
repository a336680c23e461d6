"""tools/estimate.py loaded as a module (the `cli` fixture), for the planner's command-line tests."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cli():
    spec = importlib.util.spec_from_file_location("estimate_cli", ROOT / "tools/estimate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
