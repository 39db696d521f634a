"""The package's layering: kernels import nothing above them, and no module imports in a cycle."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "moe_pallas"
# What a kernel may import from the package: pure-jnp math and the shared kernel helpers.
KERNEL_DEPS = {"moe_pallas.activations", "moe_pallas.dispatch", "moe_pallas.kernels"}


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> set[str]:
    """Package modules imported at module level (imports inside functions are deferred)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("moe_pallas")
        ):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(
                    sub
                    if (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists()
                    or (PACKAGE.parent / sub.replace(".", "/")).is_dir()
                    else node.module
                )
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("moe_pallas")}
    return found


GRAPH = {_module(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def test_kernels_import_nothing_above_them():
    for module, deps in GRAPH.items():
        if module.startswith("moe_pallas.kernels"):
            above = {d for d in deps if not any(d.startswith(k) for k in KERNEL_DEPS)}
            assert not above, f"{module} imports {sorted(above)}"
    assert not {d for d in GRAPH["moe_pallas.dispatch"] if d != "moe_pallas"}


def test_no_import_cycles():
    def visit(module, stack):
        if module in stack:
            raise AssertionError(" -> ".join([*stack[stack.index(module) :], module]))
        for dep in GRAPH.get(module, ()):
            # a package's __init__ importing its own submodules is not a cycle through them
            if dep != module and not (dep.startswith(module + ".") and module.count(".") == 1):
                visit(dep, [*stack, module])

    for module in GRAPH:
        if module != "moe_pallas":  # the public __init__ re-exports everything
            visit(module, [])
