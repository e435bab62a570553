"""The output folder's ownership: claiming it, refusing what raysearch did not create,
removing an earlier search's files on ``overwrite``, the marker and config that make it
resumable, and whether a config continues the search it holds (``resume_if_exists``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from raysearch.config import written_config
from raysearch.errors import ConfigError, InputError
from raysearch.fileio import atomic_write_text
from raysearch.layout import (
    CONFIG_FILE,
    EXPERIMENT,
    JOURNAL,
    LOCK,
    MARKER,
    OWNED,
    RAY_RESULTS,
    RESULT_FILES,
    SUMMARY,
)
from raysearch.search.record.journal import Journal

if TYPE_CHECKING:
    from raysearch.config import SearchConfig

__all__ = [
    "FolderInUse",
    "check_not_in_use",
    "hold_output_dir",
    "refuse_links",
    "check_output_dir",
    "clean_output_dir",
    "write_marker",
    "begin_session",
    "read_marker",
    "restore_marker",
    "search_id",
    "write_config",
    "storage_path",
    "continued_folder",
    "stop_changed",
    "rewrite_config",
]

_logger = logging.getLogger("raysearch.search")


def holds_search(folder: Path) -> bool:
    return any((folder / name).exists() for name in (MARKER, JOURNAL, SUMMARY))


def foreign_names(folder: Path) -> list[str]:
    """Names raysearch writes that exist in ``folder`` without a marker: not raysearch's."""
    if not folder.is_dir() or (folder / MARKER).is_file():
        return []
    return [name for name in OWNED if (folder / name).exists() or (folder / name).is_symlink()]


def check_output_dir(folder: Path, *, overwrite: bool) -> bool:
    """Whether ``folder`` holds an earlier search (that ``overwrite`` allows to replace).

    Raises:
        ConfigError: files of raysearch's names it did not create are there, or an earlier
            search without ``overwrite``.
        FolderInUse: a search is running in ``folder``.
    """
    foreign = foreign_names(folder)
    if foreign:
        names = ", ".join(f"'{n}'" for n in foreign)
        raise ConfigError(
            "output_dir",
            f"{folder} already holds {names}, not created by raysearch (no {MARKER}); "
            "choose another output_dir: raysearch never overwrites files it did not create",
        )
    check_not_in_use(folder)
    refuse_links(folder)
    previous = folder.exists() and holds_search(folder)
    if previous and not overwrite:
        raise ConfigError(
            "output_dir",
            f"{folder} holds a previous search; continue it with "
            f"`raysearch resume {folder}` or start over with --overwrite",
        )
    return previous


class FolderInUse(InputError):
    """Another search is running in the output folder (it holds :data:`LOCK`)."""


def _try_lock(handle: Any, folder: Path) -> None:
    import fcntl

    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise FolderInUse(
            f"{folder} is in use by a running search: wait for it to end, or stop it first "
            "(a search that died releases the folder)"
        ) from None
    except OSError as exc:  # ENOLCK: a network file system without locks
        _logger.warning(
            "cannot lock %s (%s): a second search started in it would not be refused",
            folder,
            exc.strerror or exc,
        )


def check_not_in_use(folder: Path) -> None:
    """Refuse ``folder`` now if a running search holds it, creating nothing."""
    try:
        handle = open(folder / LOCK)  # noqa: SIM115 - closed below
    except OSError:
        return
    with handle:
        _try_lock(handle, folder)


@contextlib.contextmanager
def hold_output_dir(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s :data:`LOCK` for the block: a second search there is refused with
    :class:`FolderInUse` while this one runs (``flock``: a killed search leaves no lock)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        handle = open(folder / LOCK, "a")  # noqa: SIM115 - closed below
    except OSError as exc:  # no lock, no search: a second one could write over this one
        raise InputError(
            f"{folder}: cannot create its lock file {LOCK} ({exc.strerror or exc}); the"
            " output folder must be writable"
        ) from None
    with handle:
        _try_lock(handle, folder)
        yield


def _names(pattern: str, trials: list[str]) -> list[str]:
    """The file names of a result folder's ``pattern`` (one per trial where it has ``{trial}``)."""
    return [pattern.format(trial=t) for t in trials] if "{" in pattern else [pattern]


def _links(folder: Path) -> list[Path]:
    """Symbolic links where raysearch writes or removes: its names in ``folder`` and in the
    result folders."""
    links = [folder / name for name in OWNED if (folder / name).is_symlink()]
    journal = folder / JOURNAL
    trials = [] if journal.is_symlink() else [str(r.trial_id) for r in Journal(journal).load()]
    for name, patterns in RESULT_FILES.items():
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            for n in (n for pattern in patterns for n in _names(pattern, trials)):
                links += [item for item in path.glob(n) if item.is_symlink()]
    return links


def refuse_links(folder: Path) -> None:
    """Refuse a search folder where a symbolic link (the user's) stands at a name raysearch
    writes or removes.

    Raises:
        ConfigError: naming the first link, where it points, and how many there are.
    """
    links = _links(folder) if folder.is_dir() else []
    if links:
        more = f" (and {len(links) - 1} more)" if len(links) > 1 else ""
        raise ConfigError(
            "output_dir",
            f"{links[0]} is a symbolic link to {os.readlink(links[0])}{more}, which raysearch "
            "did not create: it never writes through or removes a link; move it away or "
            "choose another output_dir",
        )


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _clean_result_folder(path: Path, patterns: tuple[str, ...], trials: list[str]) -> None:
    """Remove from a result folder the files raysearch writes there (the folder, left empty)."""
    for pattern in patterns:
        names = _names(pattern, trials)
        for item in (i for n in names for i in path.glob(n)):
            _remove(item)
        for n in names:  # a writer's leftovers after a kill: .<name>.<...>.tmp...
            for stem in {n, n.rsplit(".", 1)[0]}:
                for item in path.glob(f".{stem}.*"):
                    if ".tmp" in item.name:
                        _remove(item)
    with contextlib.suppress(OSError):
        path.rmdir()  # only when empty


def clean_output_dir(folder: Path, storage_owned: bool) -> None:
    """Remove what raysearch created in ``folder``, never anything else."""
    trials = [str(r.trial_id) for r in Journal(folder / JOURNAL).load()]
    for name in OWNED:
        path = folder / name
        if name == RAY_RESULTS and not storage_owned:
            continue
        if name in RESULT_FILES and path.is_dir() and not path.is_symlink():
            _clean_result_folder(path, RESULT_FILES[name], trials)
        elif name not in RESULT_FILES:  # its files, and its working folders whole
            _remove(path)
    for item in folder.glob(".*.tmp*"):
        if any(item.name.startswith(f".{name}.") for name in OWNED):
            _remove(item)
    _logger.info("overwrite: removed the previous search's files from %s", folder)


def storage_path(config: SearchConfig, folder: Path) -> str:
    """Where Ray Tune keeps the search's experiment: ``storage_path``, else ``ray_results/``."""
    return config.storage_path or str(folder / RAY_RESULTS)


def read_marker(folder: Path) -> dict[str, Any]:
    """``.raysearch.json`` as a dict; empty when it is missing or unreadable."""
    try:
        state = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_marker(folder: Path, status: str, storage_path: str, **extra: Any) -> None:
    """Update ``.raysearch.json``: the search's status and where Tune keeps its experiment."""
    state = read_marker(folder)
    state.update(
        {
            "tool": "raysearch",
            "version": 1,
            "status": status,
            "experiment": EXPERIMENT,
            "storage_path": storage_path,
            "updated_at": time.time(),
        }
    )
    state.update(extra)
    restore_marker(folder, state)


def restore_marker(folder: Path, state: dict[str, Any]) -> None:
    """Write ``.raysearch.json`` as ``state`` (:func:`read_marker`'s, put back)."""
    atomic_write_text(folder / MARKER, json.dumps(state, indent=1) + "\n")


def begin_session(folder: Path, storage_path: str) -> int:
    """Mark the search in ``folder`` running and count this session (``sessions``); its number."""
    session = int(read_marker(folder).get("sessions") or 0) + 1
    write_marker(folder, "running", storage_path, sessions=session)
    return session


def _raw_for_resume(config: SearchConfig) -> tuple[dict[str, Any], list[str]]:
    """The config as written, paths made absolute; keys holding Python objects are listed."""
    raw = dict(config.raw)
    raw["model"] = str(config.model)
    for key in ("calibration_data", "eval_data"):
        value = getattr(config, key)
        if key in raw and isinstance(value, (str, os.PathLike)):
            raw[key] = str(value)
    raw["output_dir"] = str(config.output_dir)
    return written_config(raw)


def search_id(folder: Path) -> str:
    """The search's own key (its marker's ``search_id``, else the folder): what its live
    session is found by and its study and loggers' runs are named by."""
    value = read_marker(folder).get("search_id")
    return str(value) if value else str(folder)


def write_config(folder: Path, config: SearchConfig, storage_path: str) -> None:
    """Claim ``folder`` for a new search: the marker first (with a new ``search_id``), then
    the config that ``raysearch resume`` reads."""
    raw, unserializable = _raw_for_resume(config)
    write_marker(
        folder,
        "running",
        storage_path,
        unserializable=unserializable,
        search_id=uuid.uuid4().hex,
        # Where the config's modules were found, for a resume from another folder.
        code_dirs=[str(d) for d in config.code_dirs],
    )
    _write_config_file(folder, raw)


def _write_config_file(folder: Path, raw: dict[str, Any]) -> None:
    header = "# The config of this search (paths absolute); `raysearch resume` reads it.\n"
    atomic_write_text(folder / CONFIG_FILE, header + yaml.safe_dump(raw, sort_keys=False))


def rewrite_config(folder: Path, config: SearchConfig) -> None:
    """Save ``config`` as the config of the search in ``folder`` (its id and status stay)."""
    raw, unserializable = _raw_for_resume(config)
    state = read_marker(folder)
    write_marker(
        folder,
        str(state.get("status", "running")),
        str(state.get("storage_path") or storage_path(config, folder)),
        unserializable=unserializable,
    )
    _write_config_file(folder, raw)


#: What makes a search the same one (``resume_if_exists``): its model, what it searches and
#: how it ranks.
SAME_SEARCH = ("model", "search_space", "search_spaces", "search_algo", "metric", "tolerance")


def _saved_config(folder: Path) -> dict[str, Any]:
    """The config the search in ``folder`` saved (empty when missing or unreadable)."""
    try:
        saved = yaml.safe_load((folder / CONFIG_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return saved if isinstance(saved, dict) else {}


def continued_folder(config: SearchConfig) -> Path | None:
    """The output folder when ``config`` continues the search it holds (``resume_if_exists``).

    Raises:
        ConfigError: (``resume_if_exists``) the folder holds another search.
    """
    folder = Path(config.output_dir).resolve()
    if not config.resume_if_exists or not holds_search(folder):
        return None
    saved, ours = _saved_config(folder), _raw_for_resume(config)[0]
    differ = [key for key in SAME_SEARCH[1:] if saved.get(key) != ours.get(key)]
    if Path(str(saved.get("model", ""))).resolve() != Path(config.model).resolve():
        differ.insert(0, "model")
    if differ:
        raise ConfigError(
            "resume_if_exists",
            f"{folder} holds another search (its {', '.join(differ)} differ): it continues "
            "the same search only; give another output_dir or --overwrite",
        )
    return folder


def stop_changed(folder: Path, config: SearchConfig) -> bool:
    """Whether ``config``'s stop conditions differ from those the search in ``folder`` saved."""
    return _saved_config(folder).get("stop") != _raw_for_resume(config)[0].get("stop")
