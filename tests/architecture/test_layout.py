"""The shape of the package: stages that import one way, data and analysis free of every framework,
and documentation whose command lines are the CLI's."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from catsdogs.cli import cli
from catsdogs.cli_args import expand_variadic, refuse_repeats

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "catsdogs"
FRAMEWORKS = ("keras", "tensorflow", "jax", "jaxlib")


def _module_file(name: str) -> Path | None:
    """The source file of a catsdogs module (a package's __init__.py), or None."""
    path = ROOT.joinpath(*name.split("."))
    if path.is_dir():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _imports(name: str) -> set[str]:
    """Every module a catsdogs module imports, anywhere in it (a function's lazy import too)."""
    path = _module_file(name)
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names if _module_file(f"{base}.{a.name}")}
    return out


def closure(start: str) -> set[str]:
    """Every module reachable from `start` by imports: catsdogs's own followed, others listed."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name == "catsdogs":  # the package itself, a parent of every `from catsdogs import x`: its API
            continue  # loads on attribute access alone (PEP 562), which no stage makes (and the run below shows)
        if name.split(".")[0] == "catsdogs" and _module_file(name):
            todo += [m for m in _imports(name) if m not in seen]
    return seen


def modules_of(package: str) -> list[str]:
    folder = ROOT.joinpath(*package.split("."))
    return [f"{package}.{p.relative_to(folder).with_suffix('').as_posix().replace('/', '.')}".removesuffix(".__init__")
            for p in sorted(folder.rglob("*.py"))]


@pytest.mark.parametrize("package", ["catsdogs.data", "catsdogs.analysis"])
def test_data_and_analysis_import_no_framework_anywhere_in_their_code(package):
    # given every module of the stage, and everything of catsdogs that it imports, even lazily
    reached = set().union(*(closure(m) for m in modules_of(package)))
    # then no framework is among them, nor the model (Keras) or the training stage
    assert not {m for m in reached if m.split(".")[0] in FRAMEWORKS}
    assert "catsdogs.training.model" not in reached
    assert not {m for m in reached if m.startswith(("catsdogs.training", "catsdogs.runtime"))}


STAGES = ("catsdogs.data", "catsdogs.runtime", "catsdogs.training", "catsdogs.measure", "catsdogs.analysis")


def test_the_stages_import_one_way():
    # data <- runtime (the processes and the frameworks' seam) <- training <- measure, and analysis
    # apart: no stage imports a later one, nor measure analysis, nor analysis the frameworks' side
    later = {"catsdogs.data": ("catsdogs.runtime", "catsdogs.training", "catsdogs.measure", "catsdogs.analysis"),
             "catsdogs.runtime": ("catsdogs.training", "catsdogs.measure", "catsdogs.analysis"),
             "catsdogs.training": ("catsdogs.measure", "catsdogs.analysis"),
             "catsdogs.measure": ("catsdogs.analysis",),
             "catsdogs.analysis": ("catsdogs.runtime", "catsdogs.training", "catsdogs.measure")}
    for stage, forbidden in later.items():
        for module in modules_of(stage):
            bad = {m for m in _imports(module) if m.startswith(forbidden)}
            assert not bad, f"{module} imports {sorted(bad)}"
    # and what the package root holds is shared by the stages and imports none of them (the plans,
    # the manifest, the store and the schema are contracts between stages, not parts of one)
    root = [f"catsdogs.{p.stem}" for p in PACKAGE.glob("*.py")]
    root += [f"catsdogs.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()
             and f"catsdogs.{p.name}" not in STAGES]  # the plans' package
    assert "catsdogs.plans" in root and "catsdogs.schema" in root
    for name in root:
        if name in ("catsdogs.cli", "catsdogs.cli_measure", "catsdogs.cli_options", "catsdogs.reproduce",
                    "catsdogs.__main__", "catsdogs.__init__", "catsdogs.keras", "catsdogs.api", "catsdogs.keywords"):
            continue  # the entry points, above every stage (catsdogs.keras: a callback in the user's own fit;
            # catsdogs.api: the commands as functions, catsdogs.keywords their inputs checked)
        stages = {m for m in _imports(name) if m.startswith(STAGES)}
        assert not stages, f"{name} imports {sorted(stages)}"


def _edges(name: str) -> set[str]:
    """The package's modules that importing `name` runs, by its import statements at any depth:
    each module named, the subpackages on its way (their __init__), and the package's face
    (catsdogs/__init__.py) only where a name is taken from it (`from catsdogs import __version__`,
    `import catsdogs`), not where it is only the way to a module (`from catsdogs import config`)."""
    path = _module_file(name)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named |= {a.name for a in node.names if a.name.split(".")[0] == "catsdogs"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "catsdogs":
                continue
            modules = {f"{base}.{a.name}" for a in node.names if _module_file(f"{base}.{a.name}")}
            named |= modules or {base}
            if len(modules) < len(node.names):  # a name that is no module: taken from `base` itself
                named.add(base)
    out = set()
    for module in named:
        parts = module.split(".")
        out |= {".".join(parts[:i]) for i in range(2, len(parts))}  # the subpackages on the way
        out.add(module)
    return {m for m in out if _module_file(m)} - {name}


def test_no_module_of_the_package_imports_its_face_or_itself_in_a_circle():
    # given every module of the package and what each imports, at any depth
    names = modules_of("catsdogs")
    graph = {m: _edges(m) for m in names}
    # then none but the command line's entry takes a name from the package's face (which lazily
    # loads the API: a module below it that did would import everything above it)
    assert not [m for m in names if "catsdogs" in graph[m] and m != "catsdogs.__main__"]
    # and no module reaches itself by following imports (depth-first, every path)
    done, on_path = set(), []

    def visit(module):
        if module in on_path:
            raise AssertionError(" -> ".join(on_path[on_path.index(module):] + [module]))
        if module in done:
            return
        on_path.append(module)
        for imported in sorted(graph.get(module, ())):
            visit(imported)
        on_path.pop()
        done.add(module)

    for module in names:
        visit(module)


@pytest.mark.slow
def test_data_analysis_and_the_parents_side_of_training_load_no_framework_when_run():
    # the same, as Python sees it: every module of both stages imported in a fresh interpreter,
    # with the command line and the parent's side of training (the schema, the store, the sweep
    # and its workers' handles) and of measuring (the prober, find-batch-size and its analytic
    # memory model), which start workers without importing what they run
    names = [*modules_of("catsdogs.data"), *modules_of("catsdogs.analysis"), "catsdogs.store", "catsdogs.plans",
             "catsdogs.schema", "catsdogs.messages", "catsdogs.cli", "catsdogs.training.sweep",
             "catsdogs.runtime.worker", "catsdogs.measure.prober", "catsdogs.measure.find_batch_size",
             "catsdogs.measure.profile", "catsdogs.training.costs", "catsdogs", "catsdogs.api", "catsdogs.advice"]
    code = (f"import importlib, sys; [importlib.import_module(m) for m in {names!r}]; "
            f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


MAX_FUNCTION_LINES = 80  # a function read top to bottom on one screen
MAX_MODULE_LINES = 450  # a module read top to bottom in one sitting


def test_no_function_is_longer_than_80_lines_and_no_module_longer_than_450():
    # given every module of the package, the command line's too (its option blocks included)
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(ROOT)}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}(): {length} lines")
    # then each is short enough to read whole
    assert not too_long, "\n".join(too_long)


def test_every_benchmark_and_study_is_named_where_its_figures_are_read():
    # given the benchmarks (what they measured is docs/performance.md's table) and the studies
    # (docs/results.md's findings, each with its page in studies/README.md)
    docs = {d: (ROOT / d).read_text() for d in ("docs/performance.md", "docs/results.md", "studies/README.md")}
    unnamed = [f"benchmarks/{p.name}" for p in sorted((ROOT / "benchmarks").glob("bench_*.py"))
               if f"benchmarks/{p.name}" not in docs["docs/performance.md"]]
    unnamed += [f"studies/{p.name}" for p in sorted((ROOT / "studies").glob("*.py"))
                if p.name not in docs["studies/README.md"] and f"studies/{p.name}" not in docs["docs/results.md"]]
    # then each is named there: a figure can be traced to the script that printed it
    assert not unnamed, unnamed


# --- the documentation's command lines ------------------------------------------------------------

SHELL_OPERATORS = {"&&", "||", ";", "|", ">", ">>", "<", "2>&1"}


def shell_blocks(markdown: str) -> list[str]:
    """The fenced code blocks of a Markdown text marked bash, sh or console, or unmarked."""
    blocks, current = [], None
    for line in markdown.splitlines():
        fence = re.fullmatch(r"\s*```\s*(\S*)\s*", line)
        if fence and current is None:
            current = [] if fence.group(1) in ("", "bash", "sh", "console", "shell") else False
        elif fence:
            if current is not False:
                blocks.append("\n".join(current))
            current = None
        elif current not in (None, False):
            current.append(line)
    return blocks


def documented_command_lines() -> list[tuple[str, list[str]]]:
    """(where, arguments) of every `catsdogs ...` command in the README's and docs' code blocks."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in shell_blocks(doc.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                if not re.search(r"(^|[\s/])catsdogs\s", line):
                    continue  # not a command line of ours (a diagram, another tool)
                words = shlex.split(line, comments=True)
                segment: list[str] = []
                for word in [*words, "&&"]:
                    if word in SHELL_OPERATORS:
                        rest = [w for w in segment if not re.fullmatch(r"[A-Z_]+=\S*", w)]  # env assignments
                        if rest and Path(rest[0]).name == "catsdogs":
                            found.append((f"{doc.name}: {line.strip()}", rest[1:]))
                        segment = []
                    else:
                        segment.append(word)
    return found


def test_the_readme_shows_the_commands():
    shown = {args[0] for _, args in documented_command_lines() if args}
    readme = {args[0] for where, args in documented_command_lines() if where.startswith("README.md") and args}
    assert {"prepare", "sweep", "report", "reproduce", "plans", "profile", "find-batch-size"} <= readme <= shown


@pytest.mark.parametrize("where, args", documented_command_lines(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_documented_command_line_parses(where, args):
    # given a command line as the docs show it, when the CLI's own parser reads it
    ctx = cli.make_context("catsdogs", [], resilient_parsing=True)
    if not args or args[0].startswith("-"):
        assert set(args) <= {"--version", "--help", "-h"}, where
        return
    name, command, rest = cli.resolve_command(ctx, list(args))
    assert command is not None, f"{where}: no command {args[0]!r}"
    # then every option exists and takes what it is given, and nothing is left over
    sub = click.Context(command, info_name=name, parent=ctx)
    parser = command.make_parser(sub)
    try:
        options = [p for p in command.params if isinstance(p, click.Option)]
        refuse_repeats(sub, options, rest)
        opts, leftover, _ = parser.parse_args(expand_variadic(options, rest))
    except click.UsageError as e:
        pytest.fail(f"{where}: {e.format_message()}")
    assert not leftover, f"{where}: left over {leftover}"
    for param in command.params:
        values = opts.get(param.name)
        if values is not None and isinstance(param.type, click.Choice):
            for v in values if isinstance(values, list) else [values]:
                assert v in param.type.choices, f"{where}: {param.name} {v!r}"
