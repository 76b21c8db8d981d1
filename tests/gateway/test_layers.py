"""gateway/'s wings import only from the layers below them (docs/ARCHITECTURE.md).

Every import of a gateway module, at the top of a module or inside a function,
is read from the source; a module's layer is its wing's (a top-level module is
its own). An import from the same layer or above fails, with the modules named.
"""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"

# Bottom first, as docs/ARCHITECTURE.md draws them; one line, one layer.
LAYERS = [
    ["addresses"],
    ["config"],
    ["files"],
    ["telemetry", "errors"],
    ["auth"],
    ["runtime"],
    ["wire"],
    ["backends", "outcomes"],
    ["shadow"],
    ["state"],
    ["request", "profiling"],
    ["api", "ui"],
    ["app"],
    ["extproc"],
    ["serve"],
    ["commands"],
    ["cli"],
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def _wing(module: str) -> str:
    """gateway.request.pipeline -> request; gateway.config -> config."""
    return module.split(".")[1]


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gateway."))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "gateway":  # from gateway import ui
                found.update(f"gateway.{a.name}" for a in node.names)
            elif node.module.startswith("gateway."):
                found.add(node.module)
    return found


def _modules() -> dict[str, Path]:
    out = {}
    for path in GATEWAY.rglob("*.py"):
        parts = path.relative_to(GATEWAY.parent).with_suffix("").parts
        if "pb" in parts:  # protoc's output
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def test_every_wing_and_top_level_module_has_a_layer() -> None:
    names = {_wing(m) for m in _modules() if m != "gateway"}
    assert names == set(LAYER), names ^ set(LAYER)


def test_no_module_imports_from_its_layer_or_above() -> None:
    upward = [
        f"{module} -> {target}"
        for module, path in sorted(_modules().items())
        if module != "gateway"
        for target in sorted(_imports(path))
        if _wing(target) != _wing(module) and LAYER[_wing(target)] >= LAYER[_wing(module)]
    ]
    assert not upward, upward
