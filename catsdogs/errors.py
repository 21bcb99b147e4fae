"""User-facing errors: the CLI prints them as one line and exits non-zero, never a traceback."""


class CatsdogsError(Exception):
    """Something the user can fix: bad input, a failed download, a missing data set. `hint`, when
    there is one, says what to do about it (the CLI prints it on a second line)."""

    def __init__(self, message: str = "", hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class SettingError(CatsdogsError, ValueError):
    """A setting no study can run with. `key` names it as a plan's key (`batch_size`,
    `target_ci`); the CLI turns that into its option (`--batch-size`) and a usage error (exit 2),
    a plan into `<file>: [grids.g] batch_size: ...`. The rules themselves are in catsdogs.schema."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C that the work it stopped has already reported (what was done, how to resume): the
    CLI ends with exit code 130 without saying it again."""


class DownloadError(CatsdogsError):
    """The archive could not be fetched (HTTP error, network down after every retry)."""


class UnreachableError(DownloadError):
    """No attempt reached the server: most likely no network (or a wrong host name)."""


class ChecksumError(DownloadError):
    """The bytes arrived but are not the published archive (size or SHA-256 differ)."""


class ArchiveError(CatsdogsError):
    """The archive is not a zip, is unsafe to extract, or lacks the PetImages layout."""


def os_error_line(exc: OSError) -> str:
    """What the filesystem said, in a line naming the path: "out/sub: Not a directory",
    "data: Read-only file system", "No space left on device"."""
    what = exc.strerror or str(exc) or type(exc).__name__
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    return f"{' -> '.join(paths)}: {what}" if paths else what
