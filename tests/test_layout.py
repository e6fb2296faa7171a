"""The import graph, module sizes and fixture placement the README promises."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.conftest import REPO

RUNTIME_FORBIDDEN = ("serve_app.tools", "serve_app.cost.plan", "serve_app.cost.measured", "benchmarks", "tests",
                     "matplotlib", "boto3", "httpx")
"""Nothing the serving app loads: offline tools, harnesses and their dependencies."""

LONG_MODULES = {"serve_app/tools/kuberay/objects.py"}
"""Over ~300 lines on purpose: one builder per Kubernetes object, read top to bottom."""


def imports_of(path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def python_files(package: str):
    return sorted((REPO / package).rglob("*.py"))


def test_only_the_app_entry_point_imports_the_deployments():
    importers = {str(p.relative_to(REPO)) for p in python_files("serve_app")
                 if any(name.split(".")[0] == "deployments" for name in imports_of(p))}
    assert importers == {"serve_app/app.py"}


def test_config_sits_at_the_bottom_of_the_import_graph():
    for path in python_files("serve_app/config"):
        project = {n for n in imports_of(path) if n.split(".")[0] in ("serve_app", "deployments")}
        assert all(name.startswith("serve_app.config") for name in project), (path, project)


def test_the_serving_app_never_loads_tools_or_harnesses():
    """Beyond what vLLM's OpenAI layer (which the ingress runs) loads itself."""
    code = ("import sys, vllm.entrypoints.launchers.api_server.app_state; "
            f"vllm_loads = {{m for m in sys.modules if m.startswith({RUNTIME_FORBIDDEN!r})}}; "
            "import serve_app.app, deployments.ingress, deployments.llm_server; "
            f"bad = [m for m in sys.modules if m.startswith({RUNTIME_FORBIDDEN!r}) and m not in vllm_loads]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("package", ["serve_app", "deployments"])
def test_modules_stay_small_enough_to_read_in_one_sitting(package):
    long = {str(p.relative_to(REPO)) for p in python_files(package) if len(p.read_text().splitlines()) > 300}
    assert long <= LONG_MODULES


def test_package_scoped_fixtures_live_in_a_conftest():
    """pytest tears a package-scoped fixture down at its package's end only when a
    conftest.py defines it; one in a test module (a live app) runs on beside the
    next packages' apps until the session ends."""
    def package_scoped(path) -> list[str]:
        return [node.name for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                for decorator in node.decorator_list
                if isinstance(decorator, ast.Call) and any(
                    keyword.arg == "scope" and isinstance(keyword.value, ast.Constant)
                    and keyword.value.value == "package" for keyword in decorator.keywords)]

    found = {str(p.relative_to(REPO)): package_scoped(p) for p in python_files("tests") if p.name != "conftest.py"}
    assert {path: names for path, names in found.items() if names} == {}
    assert package_scoped(REPO / "tests" / "e2e" / "conftest.py") == ["live_app"]  # the check sees them
