"""The results store: one SQLite file under --out, one row per trial. It is the contract between
training (which writes it) and analysis (which reads nothing else): a row is a trial's configuration
(schema.TrialConfig), its status (schema.Status) and its record (messages.TrialRecord), one column
per field.

A trial row is keyed by the hash of its configuration, so a trial shared by two sweeps (the Adam /
standard points belong to both of the article's figures) is run once; `sweep_trials` says which
sweeps list it. Every change is one transaction; a running trial names its owner, a sweep process
holding a lock file, so a sweep killed with kill -9 leaves rows that the next sweep can tell are
abandoned and runs again.

Several sweeps may share one store at once. Opening it (creating it, switching it to WAL, adding the
columns a newer catsdogs has) takes a file lock beside it, so processes opening it together wait
their turn rather than fail on SQLite's own lock, which its busy timeout does not cover for a change
of journal mode. A reader (the report, a dry run) opens it read-only (`read_only=True`): it writes
nothing, not even to bring an older store's columns up to date, and reads in one transaction, one
consistent snapshot while sweeps write. It shows a running trial whose sweep process is gone as
interrupted (schema.Status.INTERRUPTED); the row itself stays running until a sweep claims it again.

The store is a SQLite database in WAL mode: after a sweep is killed, finished trials may live only
in `results.sqlite-wal` beside it. Copy the store with `catsdogs report --export-store FILE`
(`Store.export_copy`: one self-contained file), never the .sqlite file alone.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import functools
import io
import json
import os
import sqlite3
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

from catsdogs import config, schema
from catsdogs.errors import CatsdogsError
from catsdogs.files import atomic_path, write_text_atomic
from catsdogs.messages import TrialRecord, columns
from catsdogs.schema import FINISHED, STORED, Status

# Every configuration field in its own column (the full configuration is in `config` too), and
# every stored field of a trial's record (catsdogs.messages.TrialRecord), typed.
CONFIG_COLUMNS = schema.sql_columns()
RESULT_COLUMNS = {name: schema.SQL_TYPES[schema.type_of(TrialRecord.__dataclass_fields__[name].type)]
                  for name in columns(TrialRecord, "stored") if name != "status"}
JSON_COLUMNS = [name for name, f in TrialRecord.__dataclass_fields__.items()
                if name in RESULT_COLUMNS and schema.type_of(f.type) is dict]  # history, env
# OUT/NAME/results.csv: the trial's configuration, its status, its record, the store's bookkeeping.
CSV_COLUMNS = [*(name for name in CONFIG_COLUMNS if name != "data"), "status",
               *columns(TrialRecord, "csv"), "attempts", "key", "error"]


def store_path(out: Path | str) -> Path:
    """The results store under an --out folder: every sweep there shares it."""
    return Path(out) / config.STORE_FILE


def _schema() -> str:
    cols = ",\n".join(f"  {k} {t}" for k, t in {**CONFIG_COLUMNS, **RESULT_COLUMNS}.items())
    return f"""
CREATE TABLE IF NOT EXISTS trials (
  key TEXT PRIMARY KEY,
  config TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT '{Status.PENDING}' CHECK (status IN {tuple(str(s) for s in STORED)}),
  owner TEXT,
  attempts INTEGER NOT NULL DEFAULT 0,
  created_at REAL, started_at REAL, finished_at REAL,
{cols}
);
CREATE TABLE IF NOT EXISTS sweeps (
  name TEXT PRIMARY KEY,
  config TEXT,
  created_at REAL,
  updated_at REAL
);
CREATE TABLE IF NOT EXISTS sweep_trials (
  sweep TEXT NOT NULL,
  key TEXT NOT NULL REFERENCES trials(key),
  position INTEGER NOT NULL,
  PRIMARY KEY (sweep, key)
);
"""


def is_store_copy(path: Path) -> bool:
    """Whether `path` is a copy `Store.export_copy` wrote: a SQLite file holding a catsdogs store's
    three tables, not in WAL mode and with no log beside it (a live store, another --out's, is in
    WAL mode: replacing it would lose a running sweep's results). What `report --export-store` may
    replace. Read only."""
    path = Path(path)
    if any(path.with_name(path.name + x).exists() for x in ("-wal", "-shm")):
        return False
    try:
        with open(path, "rb") as f:
            header = f.read(20)
        if header[:16] != b"SQLite format 3\x00" or header[18:20] != b"\x01\x01":  # 2, 2: WAL mode
            return False
        db = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            db.close()
    except (OSError, sqlite3.Error):
        return False
    return {"trials", "sweeps", "sweep_trials"} <= tables


class StoreError(CatsdogsError):
    """The results store cannot be used: not a catsdogs store, damaged, or on a disk that is full
    or read-only. One line naming the file; the file is left as it was."""


def not_a_store(path: Path, why: str) -> StoreError:
    return StoreError(f"{path} is not a catsdogs results store ({why}); it was left as it is",
                      hint="Give the --out of a catsdogs sweep, or move the file aside.")


def store_error(exc: sqlite3.DatabaseError, path: Path) -> StoreError:
    """What SQLite said, as one line about the store at `path`, with what to do."""
    text = str(exc) or type(exc).__name__
    if type(exc) is sqlite3.DatabaseError or "malformed" in text:  # not SQLite's, or a damaged page
        return StoreError(f"{path} is not a catsdogs results store, or it is damaged ({text}); it was left as it is",
                          hint="Move it aside and run the sweep again (it starts a new store), or give another --out.")
    return StoreError(f"cannot use the results store {path}: {text}",
                      hint="Every trial already finished is kept in it: make room (or give a writable --out), "
                           "then run the same command again to resume.")


def _guarded(method):
    """A Store method whose SQLite errors of the file or the disk (not of catsdogs' own SQL: an
    IntegrityError or ProgrammingError is a bug and stays one) become one StoreError."""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError):
            raise
        except sqlite3.DatabaseError as exc:
            raise store_error(exc, self.path) from None
    return guarded


class Store:
    """A connection to `out/results.sqlite`; safe with several processes writing. Every SQLite error
    of the file or the disk is a StoreError naming it (`_guarded`). `read_only`: a reader's, which
    changes nothing (a file that is no catsdogs store is a StoreError, as it is for a writer)."""

    @_guarded
    def __init__(self, path: Path | str, read_only: bool = False):
        self.path = Path(path)
        self.read_only = read_only
        self._owner_lock = None
        self.owner: str | None = None  # this process's token, once it claims a trial (become_owner)
        if read_only:
            uri = f"file:{urllib.parse.quote(str(self.path.resolve()))}?mode=ro"
            self.db = sqlite3.connect(uri, uri=True, timeout=60, isolation_level=None)
            self.db.row_factory = sqlite3.Row
            self._guard(self._check_shape)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            self.db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            self.db.row_factory = sqlite3.Row
            self._guard(self._create)

    def _guard(self, step) -> None:
        try:
            step()
        except BaseException:
            self.db.close()
            raise

    def _create(self) -> None:
        if self._tables():  # an existing database: ours, or refused before anything is added to it
            self._check_shape()
        self.db.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_schema())  # IF NOT EXISTS: idempotent
        self._add_missing_columns()

    def _tables(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def _check_shape(self) -> None:
        """A StoreError unless this database is a catsdogs store (of any version: its three tables,
        and a trial's key, configuration and status), so that nothing is read from, or added to,
        another program's SQLite file."""
        missing = {"trials", "sweeps", "sweep_trials"} - self._tables()
        if missing:
            raise not_a_store(self.path, f"no {', '.join(sorted(missing))} table")
        have = {r[1] for r in self.db.execute("PRAGMA table_info(trials)")}
        if not {"key", "config", "status", "owner"} <= have:
            raise not_a_store(self.path, "its trials table has no key, config, status or owner column")

    def _add_missing_columns(self) -> None:
        """A store written by an older catsdogs lacks the newer columns: add them (empty), so its
        rows read as they did and new rows fill them in."""
        have = {r[1] for r in self.db.execute("PRAGMA table_info(trials)")}
        for name, sql_type in {**CONFIG_COLUMNS, **RESULT_COLUMNS}.items():
            if name not in have:
                self.db.execute(f"ALTER TABLE trials ADD COLUMN {name} {sql_type}")

    def close(self) -> None:
        self.db.close()
        if self._owner_lock:
            self._owner_lock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE: take the write lock up front, so two writers never interleave."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads inside see the store as it was at the first of them, whatever sweeps write."""
        self.db.execute("BEGIN")
        try:
            yield
        finally:
            self.db.execute("COMMIT")

    # --- owners: which process runs a trial, and is it still alive ---------------------------

    def owners_dir(self) -> Path:
        return self.path.parent / ".owners"

    def become_owner(self) -> str:
        """A token naming this process while it holds the lock on its file (released at death)."""
        if self._owner_lock is None:
            token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
            self.owners_dir().mkdir(exist_ok=True)
            f = open(self.owners_dir() / token, "w")  # noqa: SIM115 - held open while we live
            fcntl.flock(f, fcntl.LOCK_EX)
            self._owner_lock, self.owner = f, token
        return self.owner

    def owner_alive(self, token: str | None) -> bool:
        if not token:
            return False
        if self._owner_lock is not None and token == self.owner:
            return True
        path = self.owners_dir() / token
        try:
            f = open(path)  # noqa: SIM115
        except FileNotFoundError:
            return False
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
        if not self.read_only:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # its process is gone: tidy up
        return False

    # --- sweeps and their trials ---------------------------------------------------------

    @_guarded
    def register_sweep(self, name: str, sweep_config: dict, configs: list[dict], overwrite: bool = False) -> list[str]:
        """Add the sweep and its trials (pending unless known); return their keys in order."""
        now = time.time()
        keys = []
        with self.transaction() as db:
            db.execute("INSERT INTO sweeps(name, config, created_at, updated_at) VALUES (?,?,?,?) "
                       "ON CONFLICT(name) DO UPDATE SET config=excluded.config, updated_at=excluded.updated_at",
                       (name, json.dumps(sweep_config), now, now))
            for pos, c in enumerate(configs):
                key = schema.TrialConfig.from_dict(c).key()
                keys.append(key)
                cols = {k: c.get(k) for k in CONFIG_COLUMNS}
                db.execute(
                    f"INSERT OR IGNORE INTO trials(key, config, status, created_at, {', '.join(cols)}) "
                    f"VALUES (?, ?, ?, ?, {', '.join('?' * len(cols))})",
                    (key, json.dumps(c, sort_keys=True), Status.PENDING, now, *cols.values()))
                db.execute("INSERT OR REPLACE INTO sweep_trials(sweep, key, position) VALUES (?,?,?)",
                           (name, key, pos))
                if overwrite:
                    self._reset(db, key)
        return keys

    def _reset(self, db, key: str) -> None:
        blank = ", ".join(f"{k}=NULL" for k in RESULT_COLUMNS)
        db.execute(f"UPDATE trials SET status=?, owner=NULL, started_at=NULL, "
                   f"finished_at=NULL, {blank} WHERE key=?", (Status.PENDING, key))

    @_guarded
    def claim(self, keys: list[str], retry_failed: bool = False) -> dict | None:
        """Mark the next runnable trial of `keys` as running by us; None when none is left.

        Runnable: pending, or running under an owner that has died (a killed sweep), or
        failed / out of memory when retrying those was asked for."""
        owner = self.become_owner()
        runnable = (Status.PENDING, Status.FAILED, Status.OOM) if retry_failed else (Status.PENDING,)
        with self.transaction() as db:
            rows = {r["key"]: r for r in db.execute(
                f"SELECT key, status, owner FROM trials WHERE key IN ({','.join('?' * len(keys))})", keys)}
            for key in keys:
                r = rows.get(key)
                if r is None:
                    continue
                if r["status"] in runnable or (r["status"] == Status.RUNNING and not self.owner_alive(r["owner"])):
                    db.execute("UPDATE trials SET status=?, owner=?, started_at=?, attempts=attempts+1 "
                               "WHERE key=?", (Status.RUNNING, owner, time.time(), key))
                    return self.get(key)
        return None

    @_guarded
    def finish(self, key: str, record: TrialRecord) -> bool:
        """Write a trial's outcome, only if we still own it; True if written."""
        if record.status not in FINISHED:
            raise ValueError(f"not a finished status: {record.status}")
        values = {k: getattr(record, k) for k in RESULT_COLUMNS}
        for k in JSON_COLUMNS:
            if values[k] is not None:
                values[k] = json.dumps(values[k])
        sets = ", ".join(f"{k}=?" for k in values)
        with self.transaction() as db:
            cur = db.execute(f"UPDATE trials SET status=?, finished_at=?, owner=NULL, {sets} "
                             "WHERE key=? AND status=? AND owner=?",
                             (record.status, time.time(), *values.values(), key, Status.RUNNING,
                              self.become_owner()))
            return cur.rowcount == 1

    @_guarded
    def release(self, key: str) -> None:
        """Give a trial we were running back to pending (interrupted, not failed)."""
        with self.transaction() as db:
            db.execute("UPDATE trials SET status=?, owner=NULL, started_at=NULL, "
                       "attempts=MAX(attempts-1, 0) WHERE key=? AND owner=?",
                       (Status.PENDING, key, self.become_owner()))

    # --- reading -----------------------------------------------------------------------------

    @_guarded
    def get(self, key: str) -> dict | None:
        r = self.db.execute("SELECT * FROM trials WHERE key=?", (key,)).fetchone()
        return self.shown(_row(r)) if r else None

    def shown(self, row: dict) -> dict:
        """A row as a reader should see it: a running trial whose owner is gone is interrupted."""
        if row["status"] == Status.RUNNING and not self.owner_alive(row.get("owner")):
            row["status"] = Status.INTERRUPTED
        return row

    @_guarded
    def sweeps(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT name FROM sweeps ORDER BY name")]

    @_guarded
    def sweep_config(self, name: str) -> dict | None:
        r = self.db.execute("SELECT config FROM sweeps WHERE name=?", (name,)).fetchone()
        return json.loads(r[0]) if r and r[0] else None

    @_guarded
    def trials(self, sweep: str | None = None) -> list[dict]:
        """Every trial (of one sweep, in its order); JSON columns decoded."""
        return [self.shown(_row(r)) for r in self._rows("t.*", sweep)]

    def _rows(self, columns: str, sweep: str | None):
        if sweep is None:
            return self.db.execute(f"SELECT {columns} FROM trials t ORDER BY created_at, key")
        return self.db.execute(f"SELECT {columns} FROM trials t JOIN sweep_trials s ON s.key = t.key "
                               "WHERE s.sweep=? ORDER BY s.position", (sweep,))

    @_guarded
    def running_elsewhere(self, keys: list[str]) -> list[int]:
        """The process ids of the live sweeps, other than this one, running trials of `keys`."""
        rows = self.db.execute(f"SELECT owner FROM trials WHERE status=? AND key IN ({','.join('?' * len(keys))})",
                               [Status.RUNNING, *keys])
        return [int(r[0].split("-")[0]) for r in rows if r[0] != self.owner and self.owner_alive(r[0])]

    @_guarded
    def counts(self, keys: list[str]) -> dict[str, int]:
        out = dict.fromkeys(STORED, 0)
        for r in self.db.execute(f"SELECT status, COUNT(*) FROM trials WHERE key IN ({','.join('?' * len(keys))}) "
                                 "GROUP BY status", keys):
            out[r[0]] = r[1]
        return out

    @_guarded
    def export_copy(self, path: Path) -> Path:
        """The whole store, with what its write-ahead log holds, as one self-contained SQLite file
        at `path` (not in WAL mode: no -wal beside it to lose), written to a temporary file and
        renamed into place, so `path` is never half a copy. A consistent snapshot while sweeps write."""
        with atomic_path(path) as tmp:
            try:
                copy = sqlite3.connect(tmp, isolation_level=None)
            except sqlite3.Error as exc:  # the copy's file, not the store: say which
                raise StoreError(f"cannot write the copy {path}: {exc}") from None
            try:
                self.db.backup(copy)
                copy.execute("PRAGMA journal_mode=DELETE")
            finally:
                copy.close()
        return Path(path)

    @_guarded
    def sweeps_of(self, key: str) -> list[str]:
        """The sweeps that list trial `key` (a trial two sweeps share is run once, for both)."""
        return [r[0] for r in self.db.execute("SELECT sweep FROM sweep_trials WHERE key=? ORDER BY sweep", (key,))]

    @_guarded
    def export_csv(self, sweep: str, path: Path) -> Path:
        """outputs/NAME/results.csv, replaced atomically so a reader never sees half a file. Read and written
        under a lock beside it, so that of two processes exporting one sweep's CSV at once (two sweeps
        sharing its trials), the one that reads the store last writes last: never older than the store."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(f".{path.name}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows([CSV_COLUMNS, *self._csv_rows(sweep)])
            return write_text_atomic(path, buf.getvalue())

    def _csv_rows(self, sweep: str) -> Iterator[list]:
        """The CSV's rows as `trials` shows them, no trial's JSON decoded (a race exports after each of its
        150 trials: `trials` decoded 11,000 histories); a writer's store has every column."""
        status = CSV_COLUMNS.index("status")
        for owner, *row in self._rows(", ".join(["t.owner", *("t." + c for c in CSV_COLUMNS)]), sweep):
            row[status] = self.shown({"status": row[status], "owner": owner})["status"]
            yield row


def _row(r: sqlite3.Row) -> dict:
    # a store of an older catsdogs, read without adding its missing columns: they read as empty
    d = {**dict.fromkeys(CONFIG_COLUMNS), **dict.fromkeys(RESULT_COLUMNS), **dict(r)}
    for k in ("config", *JSON_COLUMNS):
        if d.get(k):
            d[k] = json.loads(d[k])
    return d
