"""What every `catsdogs` command shares: its click classes and its common options.

`OneLineErrors` (the group) prints every error a user can fix as one line, no traceback: a
usage error exit 2, a CatsdogsError exit 1 (its hint on a second line), Ctrl-C 130. `Command`
reads the command line first (catsdogs.cli_args: `--opt adam sgd`, an option given twice
refused) and turns a SettingError from the library into a usage error naming the option its key
stands for; `TrainingCommand` checks the Keras backend before any work. Every rule of a value
lives with the library (catsdogs.schema, catsdogs.plans, each stage's own checks); the callbacks
here only apply them at parse time.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from catsdogs import config, plans, schema
from catsdogs.cli_args import expand_variadic, refuse_repeats
from catsdogs.errors import CatsdogsError, Interrupted, SettingError, os_error_line
from catsdogs.keywords import keyword


def kw(key: str) -> click.ParamType:
    """The option's type from the keywords' table (catsdogs.keywords.KEYWORDS): the same bounds and
    choices as the Python API's keyword of that meaning."""
    return keyword(key).click_type(key)


class OneLineErrors(click.Group):
    """click prints usage errors over three lines; ours fit on one, and CatsdogsError too."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as e:
            where = f" (see `{e.ctx.command_path} --help`)" if e.ctx else ""
            click.echo(f"Error: {e.format_message()}{where}", err=True)
            sys.exit(2)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except click.Abort as e:  # Ctrl-C: said once, by what it stopped or here
            if not isinstance(e.__cause__, Interrupted):
                click.echo("Interrupted.", err=True)
            sys.exit(130)
        except SettingError as e:  # one that no command placed: a usage error all the same
            click.echo(f"Error: {e}", err=True)
            sys.exit(2)
        except CatsdogsError as e:
            click.echo(f"Error: {e}", err=True)
            if e.hint:  # what to do about it, on a line of its own
                click.echo(e.hint, err=True)
            sys.exit(1)
        except OSError as e:  # the filesystem's answer (a path that is a file, a read-only or full disk)
            click.echo(f"Error: {os_error_line(e)}", err=True)
            sys.exit(1)
        except sqlite3.DatabaseError as e:  # SQLite's, met outside the store's own guard
            click.echo(f"Error: the results store cannot be used: {e}", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


class Command(click.Command):
    """A catsdogs command: `--opt adam sgd` means `--opt adam --opt sgd` for options declared
    multiple=True, an option of one value given twice is refused (catsdogs.cli_args), and a
    SettingError from the library becomes a usage error naming the option its key stands for."""

    def parse_args(self, ctx, args):
        options = [p for p in self.params if isinstance(p, click.Option)]
        refuse_repeats(ctx, options, args)
        return super().parse_args(ctx, expand_variadic(options, args))

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SettingError as e:
            raise self.usage_error(ctx, e) from None
        except KeyboardInterrupt as e:  # Ctrl-C: to OneLineErrors as click's own, without its blank line
            raise click.Abort() from e

    def usage_error(self, ctx, e: SettingError) -> click.UsageError:
        """--batch-size's error for key batch_size when the value came from the command line; a
        value the command line did not give (a plan's, or a default) keeps the library's own words."""
        param = next((p for p in self.params if e.key and (p.name == e.key or f"--{e.key.replace('_', '-')}"
                                                            in getattr(p, "opts", ()))), None)
        from_plan = isinstance(e, plans.PlanError) and (param is None or not given(ctx, param.name))
        if param is None or from_plan or not given(ctx, param.name):  # a plan's value, or a default
            return click.UsageError(str(e), ctx)
        return click.BadParameter(getattr(e, "reason", str(e)), ctx, param)


class TrainingCommand(Command):
    """A command that trains: its Keras backend (KERAS_BACKEND) must be one catsdogs runs on and
    be installed, checked once its options parse (so --help always works), before any work."""

    def invoke(self, ctx):
        from catsdogs.runtime import backends

        backends.current()  # a CatsdogsError: one line, exit 1
        return super().invoke(ctx)


def given(ctx: click.Context, name: str) -> bool:
    """Whether the option `name` was given on the command line (or in the environment)."""
    return ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None)


# --- callbacks: a value's rule, from the library, at parse time -------------------------------------


def checked(rule):
    """A click callback applying `rule(value)` (a SettingError becomes this option's error)."""
    def callback(ctx, param, value):
        if value is None:
            return None
        try:
            return rule(value)
        except SettingError as e:
            raise click.BadParameter(str(e), ctx, param) from None
    return callback


WORKERS_LIMIT = checked(lambda v: schema.check_number(v, "workers"))


def limited(ctx, param, value):
    """A whole number under its limit (schema.LIMITS, by the option's plan key)."""
    return checked(lambda v: schema.check_number(v, param.name))(ctx, param, value)


def memory(value: str) -> int:
    from catsdogs.measure.common import check_memory_limit, parse_memory

    return check_memory_limit(parse_memory(value))


def source(value: str) -> str:
    from catsdogs.data.source import check_source

    return check_source(value)


def options(*decorators):
    """Apply option decorators in the order --help lists them."""
    def apply(f):
        for decorator in reversed(decorators):
            f = decorator(f)
        return f
    return apply


DATA_DIR = click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help=f"Where the prepared data lives [default: ${config.DATA_DIR_ENV} or "
                             f"./{config.DEFAULT_DATA_DIR}].")
ISOLATE = click.option("--isolate", is_flag=True,
                       help="Run each trial (or probe) in a fresh process, as catsdogs 0.2 did: slower "
                            "(every trial imports, loads its data and compiles again), for anyone who "
                            "wants no process reused.")


DETERMINISTIC = click.option("--deterministic/--no-deterministic", default=None,
                             help=schema.DETERMINISTIC_HELP)
TF32 = click.option("--tf32/--no-tf32", default=None, help=schema.TF32_HELP)
COMPILE_CACHE = click.option(
    "--compile-cache/--no-compile-cache", default=True, show_default=True,
    help="JAX: keep every compiled step in JAX's persistent compilation cache, in catsdogs/jax-compilation "
         "under the user's cache folder ($XDG_CACHE_HOME, else ~/.cache; $CATSDOGS_COMPILE_CACHE names "
         "another), so that running a plan again, even into a fresh --out, loads its steps instead of "
         "compiling them. Nothing on TensorFlow.")


def worker_env(compile_cache: bool) -> dict:
    """What the workers' environment adds for the command line's process options."""
    from catsdogs.runtime.backends import COMPILE_CACHE_ENV

    return {} if compile_cache else {COMPILE_CACHE_ENV: "off"}


def out_option(help: str):
    return click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path(config.DEFAULT_OUT),
                        show_default=True, help=help)


def name_option(default: str | None, help: str):
    return click.option("--name", default=default, show_default=default is not None,
                        callback=checked(schema.check_run_name), help=help)
