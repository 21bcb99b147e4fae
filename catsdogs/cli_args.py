"""The command line as catsdogs reads it before click parses it (catsdogs.cli.Command): `--opt
adam sgd` as `--opt adam --opt sgd` for the options that take several values (click has no
variadic options; rewriting the arguments keeps every other behaviour click's own), and an option
of one value given twice with two values refused (click keeps the last without a word).
"""

from __future__ import annotations

import re

import click


def _is_value(arg: str) -> bool:
    return not arg.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", arg) is not None


def expand_variadic(options: list[click.Option], args: list[str]) -> list[str]:
    """`--opt adam sgd` as `--opt adam --opt sgd`, for each option that takes several values."""
    names = {n for p in options if p.multiple for n in p.opts}
    out: list[str] = []
    current = None  # the variadic option whose values we are reading
    for i, a in enumerate(args):
        if a == "--":
            out += args[i:]
            break
        if a in names:
            nxt = args[i + 1] if i + 1 < len(args) else None
            current = a if nxt is not None and _is_value(nxt) else None
            if current is None:
                out.append(a)  # no value follows: click reports it
        elif a.startswith("--") and a.split("=", 1)[0] in names:
            current = a.split("=", 1)[0]
            out += [current, a.split("=", 1)[1]]
        elif current and _is_value(a):
            out += [current, a]
        else:
            current = None
            out.append(a)
    return out


def refuse_repeats(ctx: click.Context, options: list[click.Option], args: list[str]) -> None:
    """A usage error for an option of one value given twice with two values: `--until val_loss=0.5
    --until val_loss=0.4` ran to 0.4 without a word. The same value twice is no contradiction (two
    spellings of one value, `8G` and `8192M`, are refused too: the words are compared). Not while
    click completes a word (resilient parsing) or where --help is asked for: help comes first."""
    if ctx.resilient_parsing or "--help" in args[: args.index("--") if "--" in args else len(args)]:
        return
    single = {n: p for p in options if not p.multiple and not p.is_flag for n in p.opts}
    seen: dict[str, list[str]] = {}
    for i, a in enumerate(args):
        if a == "--":
            break
        name, eq, value = a.partition("=")
        if name in single:
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            seen.setdefault(single[name].opts[-1], []).append(value)
    for name, values in seen.items():
        if len(set(values)) > 1:
            raise click.UsageError(f"{name} given {len(values)} times ({', '.join(values)}): give it once", ctx)
