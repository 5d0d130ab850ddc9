"""The folders are the architecture: what each may import (ARCHITECTURE.md section 3), checked by
reading every import, and the torch-free folders imported where torch cannot be."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import aioworker

PACKAGE = Path(aioworker.__file__).parent
TORCH_FREE = ("config", "core", "wire", "runtime", "checkpoint", "api")

# Never imported from a folder, by module prefix ("aioworker.x" names our folders).
NEVER = {
    "config": ("torch", "zmq", "aioworker.compute", "aioworker.core", "aioworker.wire"),
    "core": ("torch", "zmq", "aioworker.compute", "aioworker.wire", "aioworker.runtime"),
    "compute": ("zmq", "socket", "aioworker.wire", "aioworker.runtime"),
    "wire": ("torch", "aioworker.compute", "aioworker.runtime"),
    "runtime": ("torch", "aioworker.compute"),
    "checkpoint": ("torch", "aioworker.compute", "aioworker.runtime", "aioworker.wire"),
    "api": ("torch", "aioworker.compute", "aioworker.runtime"),
}
FACES = ("aioworker.cli", "aioworker.bench", "aioworker.engine")
# Besides the standard library and the package itself: the only outside imports allowed.
THIRD_PARTY = {
    "config": {"msgspec"},
    "core": {"msgspec", "numpy"},
    "wire": {"msgspec", "zmq"},
    "runtime": {"msgspec", "zmq", "uvloop", "prometheus_client"},
    "checkpoint": {"msgspec", "numpy", "gguf", "safetensors", "tokenizers", "jinja2", "tqdm"},
    "api": {"msgspec", "fastapi", "starlette", "uvicorn", "prometheus_client"},
}
# Our modules each folder may import.
OURS = {
    "config": ("aioworker.config",),
    "core": ("aioworker.core", "aioworker.config"),
    "wire": ("aioworker.wire", "aioworker.core", "aioworker.config"),
    "runtime": ("aioworker.runtime", "aioworker.wire", "aioworker.core", "aioworker.config"),
    "checkpoint": ("aioworker.checkpoint",),
    "api": (
        "aioworker.api",
        "aioworker.wire",
        "aioworker.core",
        "aioworker.checkpoint",
        "aioworker.config",
        "aioworker.version",
    ),
}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def folder_modules(folder: str, package: Path = PACKAGE) -> list[Path]:
    return sorted((package / folder).rglob("*.py"))


def imports_of(path: Path, package: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module_name(path, package).split(".")
                keep = len(parts) - node.level + (path.name == "__init__.py")
                base = ".".join([*parts[:keep], base]).rstrip(".")
            found.append((node.lineno, base))
    return found


def matches(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def rule_breaks(folder: str, package: Path = PACKAGE) -> list[str]:
    """Every import in `folder` that its rules forbid, as `file:line imports module`."""
    breaks = []
    for path in folder_modules(folder, package):
        for line, name in imports_of(path, package):
            top = name.split(".")[0]
            if matches(name, NEVER[folder] + FACES):
                why = "never"
            elif top == "aioworker" and folder in OURS and not matches(name, OURS[folder]):
                why = "not among its folders"
            elif top != "aioworker" and folder in THIRD_PARTY:
                is_allowed = top in sys.stdlib_module_names or top in THIRD_PARTY[folder]
                why = None if is_allowed else "not among its libraries"
            else:
                why = None
            if why:
                breaks.append(f"{path.relative_to(package.parent)}:{line} imports {name} ({why})")
    return breaks


def test_every_folder_imports_only_what_its_rules_allow() -> None:
    breaks = [b for folder in NEVER for b in rule_breaks(folder)]
    assert not breaks, "folder rules broken:\n" + "\n".join(breaks)


# Runs in a fresh interpreter where `import torch` fails; prints one line per module that
# reached torch anyway, with the chain of modules whose top level led there.
_IMPORT_ALL = """
import importlib, sys, traceback
sys.modules["torch"] = None
failures = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        chain = [f.filename for f in frames if f.name == "<module>" and f.filename != "<string>"]
        failures.append(name + ": " + " -> ".join(chain) + " -> " + str(exc))
print("\\n".join(failures))
"""


def torch_free_failures(modules: list[str], search_path: Path | None = None) -> list[str]:
    prefix = f"import sys; sys.path.insert(0, {str(search_path)!r})\n" if search_path else ""
    done = subprocess.run(
        [sys.executable, "-c", prefix + _IMPORT_ALL, *modules],
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if line]


def test_torch_free_folders_import_where_torch_cannot() -> None:
    # The command line too: `aioworker --help` builds every subcommand's parser, and the
    # control-plane tools (admin, top, keys, serve's launcher) must start in well under a second.
    folders = (*TORCH_FREE, "cli")
    modules = [module_name(p) for folder in folders for p in folder_modules(folder)]
    modules.append("aioworker.engine")
    assert len(modules) > 50
    failures = torch_free_failures(modules)
    assert not failures, "modules that import torch:\n" + "\n".join(failures)


def test_the_import_check_names_the_module_and_the_chain(tmp_path: Path) -> None:
    """A module that reaches torch through another is reported with both, in order."""
    (tmp_path / "leaf.py").write_text("import torch\n")
    (tmp_path / "middle.py").write_text("import leaf\n")
    [line] = torch_free_failures(["middle"], search_path=tmp_path)
    assert line.startswith("middle: ")
    assert line.index("middle.py") < line.index("leaf.py") < line.index("torch")


def test_the_rules_catch_torch_or_a_socket_where_they_do_not_belong(tmp_path: Path) -> None:
    package = tmp_path / "aioworker"
    for folder, source in {
        "core": "import torch\nfrom aioworker.runtime import driver\n",
        "compute": "import zmq\nfrom ..wire import protocol\n",
    }.items():
        (package / folder).mkdir(parents=True)
        (package / folder / "bad.py").write_text(source)
    assert rule_breaks("core", package) == [
        "aioworker/core/bad.py:1 imports torch (never)",
        "aioworker/core/bad.py:2 imports aioworker.runtime (never)",
    ]
    assert rule_breaks("compute", package) == [
        "aioworker/compute/bad.py:1 imports zmq (never)",
        "aioworker/compute/bad.py:2 imports aioworker.wire (never)",
    ]
