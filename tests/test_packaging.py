"""What ships: the Dockerfile lints clean, its entry command runs outside Docker, the wheel the
image installs carries the SQL and TOML files, compose.yaml wires the binding variable names."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import httpx
import yaml

from .conftest import wait_ready
from .fakes import free_port

ROOT = Path(__file__).resolve().parent.parent


def _instruction(name: str) -> list[str]:
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith(name + " "):
            return json.loads(line[len(name) + 1:])
    raise AssertionError(f"no {name} in the Dockerfile")


def test_dockerfile_lints_clean():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run([hadolint, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_is_multi_stage_and_unprivileged():
    text = (ROOT / "Dockerfile").read_text()
    stages = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert len(stages) == 2 and " AS build" in stages[0]
    final = text.rsplit(stages[1] + "\n", 1)[1]
    assert "USER 10001" in final and "uv" not in final.split("COPY --from=build")[0]
    assert "/bin/uv" not in final  # no build tools in the final image


def test_the_images_entry_command_serves_outside_docker(database_url, upstream_url, tmp_path):
    command = _instruction("ENTRYPOINT") + _instruction("CMD")
    assert command[:2] == ["branchpoint", "serve"]
    port = free_port()
    args = [a if a != "0.0.0.0" else "127.0.0.1" for a in command[1:]]
    args[args.index("--port") + 1] = str(port)
    env = {**os.environ, "BRANCHPOINT_DATABASE_URL": database_url, "BRANCHPOINT_UPSTREAM_URL": upstream_url,
           "BRANCHPOINT_DATA_DIR": str(tmp_path), "BRANCHPOINT_CONFIG": ""}
    binary = str(Path(sys.executable).parent / command[0])
    proc = subprocess.Popen([binary, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=10,
                       headers={"Authorization": "Bearer sk-docker", "X-Conversation-Id": "docker"},
                       json={"model": "m", "messages": [{"role": "user", "content": "from the image command"}]})
        assert r.status_code == 200 and r.headers["x-node-id"]
    finally:
        proc.terminate()
        proc.wait(20)


def test_the_wheel_carries_sql_toml_and_the_viewer(tmp_path):
    uv = shutil.which("uv")
    result = subprocess.run([uv, "build", "--wheel", "--out-dir", str(tmp_path), str(ROOT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    wheel = next(tmp_path.glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "storage/functions.sql" in names and "config/defaults.toml" in names
    viewer = {f"proxy/ui/{p.name}" for p in (ROOT / "proxy" / "ui").iterdir()}
    assert "proxy/ui/index.html" in viewer and viewer <= names
    assert {f"storage/migrations/{p.name}" for p in (ROOT / "storage" / "migrations").glob("*.*")} <= names
    functions = {f"storage/functions/{p.name}" for p in (ROOT / "storage" / "functions").glob("*.sql")}
    assert "storage/functions/calls.sql" in functions and functions <= names  # each file functions.sql lists
    assert not any(n.startswith("tests/") for n in names)


def test_compose_file_wires_postgres_and_the_binding_variables():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "branchpoint"} <= set(services)
    env = services["branchpoint"]["environment"]
    assert env["BRANCHPOINT_DATABASE_URL"].startswith("postgresql://") and "@postgres:5432/" in env["BRANCHPOINT_DATABASE_URL"]
    assert "BRANCHPOINT_UPSTREAM_URL" in env
    assert services["branchpoint"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert shlex.join(services["branchpoint"]["command"]).startswith("serve --host 0.0.0.0")
    # Docker's stop waits past the proxy's shutdown grace, or calls in flight are killed, not interrupted
    grace = tomllib.loads((ROOT / "config" / "defaults.toml").read_text())["server"]["shutdown_grace_seconds"]
    assert int(services["branchpoint"]["stop_grace_period"].removesuffix("s")) > grace


def test_every_third_party_module_the_product_imports_is_a_declared_dependency():
    # a module that only a dev dependency brings in (zstandard, through langsmith) installs in
    # the test venv but not in the image: its first import would fail there
    import ast
    import importlib.metadata as md

    wanted: dict[str, set[str]] = {}  # declared distribution -> the extras asked for
    for req in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        match = re.match(r"([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?", req)
        wanted[_norm(match.group(1))] = {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}
    installed_with = _closure(wanted)
    dists = md.packages_distributions()
    ours = {"proxy", "storage", "config"}
    missing = {}
    for package in ours:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
                for name in names:
                    top = name.split(".")[0]
                    if top in ours or top in sys.stdlib_module_names:
                        continue
                    if not {_norm(d) for d in dists.get(top, [top])} & installed_with:
                        missing.setdefault(top, str(path.relative_to(ROOT)))
    assert missing == {}, f"imported but not declared in [project] dependencies: {missing}"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(wanted: dict[str, set[str]]) -> set[str]:
    """Every distribution a plain install of the declared dependencies brings (their own
    requirements, and those of the extras asked for -- uvicorn[standard]'s -- but no other extra)."""
    import importlib.metadata as md

    seen: set[str] = set()
    todo = [(name, extras) for name, extras in wanted.items()]
    while todo:
        name, extras = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for req in requires:
            marker = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", req)
            if marker and marker.group(1) not in extras:
                continue
            sub = re.match(r"([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?", req)
            todo.append((_norm(sub.group(1)), {e.strip() for e in (sub.group(2) or "").split(",") if e.strip()}))
    return seen
