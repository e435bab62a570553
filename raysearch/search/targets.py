"""What a search writes outside its output folder, checked (creating and writing nothing)
before the output folder is claimed: the Optuna storage (``optuna_storage``), MLflow's
``tracking_uri`` and ``registry_uri``, W&B's ``dir`` and API key. A tracking server is not
contacted; another database is connected to; Optuna opens one holding its tables read-only.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from raysearch.errors import ConfigError

__all__ = ["check_targets", "check_optuna_storage"]

#: The tables of an Optuna RDB storage (any one of them: Optuna's schema is there).
_OPTUNA_TABLES = {"studies", "version_info", "trials"}


def check_targets(config: Any) -> None:
    """Check every place ``config`` writes to outside its output folder.

    Raises:
        ConfigError: one the search could not open or write, named by its config key.
    """
    if getattr(config, "optuna_storage", None):
        check_optuna_storage(config.optuna_storage)
    for name, settings in getattr(config, "loggers", ()):
        if name == "mlflow":
            _check_mlflow(settings)
        elif name == "wandb":
            _check_wandb(settings)


def check_optuna_storage(url: str, key: str = "optuna_storage") -> None:
    """Check that Optuna can open the RDB storage ``url`` and write a study into it.

    Raises:
        ConfigError: it cannot, with the reason.
    """
    try:
        _check_database(url)
    except _Refused as exc:
        raise ConfigError(key, f"Optuna cannot open {url} ({exc})") from None


class _Refused(Exception):
    """Why a target cannot be used, in words."""


def _sqlite_file(url: str) -> Path | None:
    """The database file of an SQLite URL (``sqlite:///a.db`` relative to the working
    directory, ``sqlite:////abs/a.db``); None for an in-memory database or another URL."""
    scheme, sep, rest = url.partition(":///")
    if not sep or not scheme.startswith("sqlite"):
        return None
    database = unquote(rest.partition("?")[0])
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database).absolute()


def _sqlite_tables(path: Path) -> set[str] | None:
    """The tables of the SQLite database ``path`` (None: not there yet, its folder writable);
    :class:`_Refused` when it cannot be written or is no database."""
    if not path.exists():
        if not path.parent.is_dir():
            raise _Refused(f"no folder {path.parent} for its database file")
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise _Refused(f"the folder {path.parent} is not writable")
        return None
    if not path.is_file():
        raise _Refused(f"{path} is not a file")
    if not os.access(path, os.R_OK | os.W_OK):
        raise _Refused(f"{path} is not writable")
    # A process killed mid-write leaves a hot journal, which only a writing connection may
    # roll back (as MLflow's or Optuna's next open does): a read-only one is refused.
    hot = any(path.with_name(path.name + end).exists() for end in ("-journal", "-wal"))
    try:
        connection = sqlite3.connect(path.as_uri() + ("" if hot else "?mode=ro"), uri=True)
        try:
            rows = connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
            return {name for (name,) in rows}
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise _Refused(f"{path}: {exc}") from None


def _check_database(url: str) -> None:
    """Connect to the database ``url`` (an SQLite file read, or its folder checked) and open it
    with Optuna when it holds Optuna's tables."""
    import sqlalchemy

    path = _sqlite_file(url)
    if path is not None:
        if (_sqlite_tables(path) or set()) & _OPTUNA_TABLES:
            _open_with_optuna(f"sqlite:///{path.as_uri()}?mode=ro&uri=true")
        return
    try:
        engine = sqlalchemy.create_engine(url)
        with engine.connect() as connection:
            tables = set(sqlalchemy.inspect(connection).get_table_names())
        engine.dispose()
    except Exception as exc:  # noqa: BLE001 - the driver's or the server's refusal, in words
        raise _Refused(_reason(exc)) from None
    if tables & _OPTUNA_TABLES:
        _open_with_optuna(url)


def _open_with_optuna(url: str) -> None:
    """Open the Optuna storage ``url`` without creating tables and list its studies."""
    import optuna

    try:
        storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
        optuna.study.get_all_study_names(storage)
        storage.engine.dispose()
    except Exception as exc:  # noqa: BLE001 - Optuna's refusal, in words
        raise _Refused(_reason(exc)) from None


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_folder(folder: str, key: str) -> None:
    """Check that ``folder`` is a folder this user can write in or create.

    Raises:
        ConfigError: it cannot be, naming ``key``.
    """
    path = Path(folder).expanduser().absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(key, f"{folder}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = (
            "is not writable"
            if existing == path
            else f"cannot be created ({existing} is not writable)"
        )
        raise ConfigError(key, f"{folder} {what}")


def _check_mlflow(settings: Mapping[str, Any]) -> None:
    """MLflow's tracking and registry URIs (MLflow's default tracking URI when none is given)."""
    for setting in ("tracking_uri", "registry_uri"):
        uri = settings.get(setting)
        if uri is None and setting == "tracking_uri":
            import mlflow

            uri = mlflow.get_tracking_uri()
        if uri is None:
            continue
        key = f"loggers.mlflow.{setting}"
        uri = str(uri)
        scheme = urlparse(uri).scheme
        if scheme in ("", "file"):
            _check_file_store(uri, key)
            continue
        if scheme.startswith(("http", "databricks")) or "://" not in uri:
            continue  # a tracking server: not contacted
        try:
            _check_database(uri)
        except _Refused as exc:
            raise ConfigError(key, f"MLflow cannot open {uri} ({exc})") from None


def _check_file_store(uri: str, key: str) -> None:
    """MLflow's file store at ``uri``: only with ``MLFLOW_ALLOW_FILE_STORE=true`` (MLflow 3)."""
    from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE

    if not MLFLOW_ALLOW_FILE_STORE.get():
        raise ConfigError(
            key,
            f"{uri}: MLflow 3 keeps its file store behind MLFLOW_ALLOW_FILE_STORE=true; "
            "set it, or use a database such as sqlite:///mlflow.db",
        )
    path = unquote(urlparse(uri).path) if uri.startswith("file:") else uri
    check_folder(path, key)


def _check_wandb(settings: Mapping[str, Any]) -> None:
    """W&B's ``dir``, and online an API key where Ray's callback looks for one."""
    if settings.get("dir") is not None:
        check_folder(str(settings["dir"]), "loggers.wandb.dir")
    mode = settings.get("mode") or os.environ.get("WANDB_MODE") or "online"
    if mode in ("offline", "disabled") or os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        return
    key_file = settings.get("api_key_file")
    if key_file is not None:
        if not os.access(Path(key_file).expanduser(), os.R_OK):
            raise ConfigError("loggers.wandb.api_key_file", f"{key_file} cannot be read")
        return
    if settings.get("api_key") or os.environ.get("WANDB_API_KEY"):
        return
    if os.environ.get("WANDB_SETUP_API_KEY_HOOK"):
        return  # Ray calls the hook itself
    import wandb

    if wandb.login(prompt=False, verify=False):  # a key wandb login saved
        return
    raise ConfigError(
        "loggers.wandb",
        f"W&B's mode {mode} needs an API key (WANDB_API_KEY, api_key, api_key_file or "
        "`wandb login`); mode: offline needs none",
    )
