"""The progress of a batch as one line over its models, as ``raysearch run`` has over its
trials: the models done, running, failed and waiting, the trials their searches finished
(from each journal), and the elapsed time. Redrawn in place on a terminal; into a file or
pipe, written when it changed, at most every ``every_s`` seconds.

Example:
    >>> import io
    >>> out = io.StringIO()
    >>> meter = BatchProgress(Path("no_such_batch"), ["mlp", "cnn"], out, clock=lambda: 0.0)
    >>> meter.update(running=["mlp"], done=[], failed=[], waiting=1)
    >>> out.getvalue()
    '[batch] models 0/2 done, 1 running, 0 failed, 1 waiting | trials 0 done | mlp 0 | 00:00\\n'
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TextIO

from raysearch.layout import JOURNAL
from raysearch.ranking import is_candidate

__all__ = ["BatchProgress"]

#: Seconds between two redraws on a terminal.
_TTY_EVERY_S = 1.0


class BatchProgress:
    """One progress line over the models ``names`` of the batch in ``out``, on ``stream``.

    Args:
        out: the batch's folder.
        names: every model of the batch, as its summary lists them.
        stream: where the line goes.
        every_s: on a file or pipe, the least seconds between two lines.
        clock: the clock of the elapsed time (``time.monotonic``).
        searched: the models whose journals the trials are counted from (default: ``names``).
        fresh: models whose search starts over (``--overwrite``): an earlier journal in their
            folder is not counted.
    """

    def __init__(
        self,
        out: Path,
        names: Sequence[str],
        stream: TextIO | None,
        *,
        every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        searched: Iterable[str] | None = None,
        fresh: Iterable[str] = (),
    ) -> None:
        self.out = Path(out)
        self.names = list(names)
        self.searched = list(self.names if searched is None else searched)
        #: The journal each fresh model's folder held when the batch started (None: none).
        self._replaced = {name: _journal_stamp(self.out / name / JOURNAL) for name in fresh}
        self.stream = stream
        self.every_s = every_s
        self.clock = clock
        self.started = clock()
        self._tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self._drawn = False
        self._last_at = float("-inf")
        self._last_said = ""
        #: Each model's journal as last read: its stamp and (done, failed, candidates).
        self._journals: dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]] = {}

    def _trials(self, name: str) -> tuple[int, int, int]:
        """The trials the search of ``name`` finished so far: done, failed, candidates."""
        from raysearch.search.record.journal import Journal

        path = self.out / name / JOURNAL
        stamp = _journal_stamp(path)
        if stamp is None:
            return (0, 0, 0)
        if name in self._replaced:
            if stamp == self._replaced[name]:
                return (0, 0, 0)  # still the earlier search's, which --overwrite replaces
            del self._replaced[name]
        kept = self._journals.get(name)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        records = Journal(path).load()
        counts = (
            len(records),
            sum(1 for r in records if not r.ok),
            sum(1 for r in records if is_candidate(r)),
        )
        self._journals[name] = (stamp, counts)
        return counts

    def line(
        self, running: Iterable[str], done: Iterable[str], failed: Iterable[str], waiting: int
    ) -> str:
        """The line for these models, and how many are ``waiting`` to start."""
        running, done, failed = list(running), list(done), list(failed)
        counts = {name: self._trials(name) for name in self.searched}
        trials, trials_failed, candidates = map(sum, zip((0, 0, 0), *counts.values()))
        models = (
            f"models {len(done)}/{len(self.names)} done, {len(running)} running, "
            f"{len(failed)} failed" + (f", {waiting} waiting" if waiting else "")
        )
        said = [f"trials {trials} done"]
        if trials_failed:
            said.append(f"{trials_failed} failed")
        if candidates:
            said.append(f"{candidates} candidates")
        each = ", ".join(f"{name} {counts.get(name, (0,))[0]}" for name in running)
        parts = [models, ", ".join(said)] + ([each] if each else [])
        return " | ".join(parts)

    def update(
        self,
        running: Iterable[str],
        done: Iterable[str],
        failed: Iterable[str],
        waiting: int,
        *,
        force: bool = False,
    ) -> None:
        """Print the line when it is due (``force``: now)."""
        if self.stream is None:
            return
        now = self.clock()
        wait = _TTY_EVERY_S if self._tty else self.every_s
        if not force and now - self._last_at < wait:
            return
        said = self.line(running, done, failed, waiting)
        if not self._tty and said == self._last_said and not force:
            return  # nothing changed since the last line
        self._last_at, self._last_said = now, said
        text = f"[batch] {said} | {_clock(now - self.started)}"
        if self._tty:
            self.stream.write("\r\033[K" + text)
            self._drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def say(self, text: str) -> None:
        """Print an event line (a model started, ended) above the progress line."""
        if self.stream is None:
            return
        if self._drawn:
            self.stream.write("\r\033[K")
            self._drawn = False
            self._last_at = float("-inf")  # redraw at the next update
        print(f"[batch] {text}", file=self.stream, flush=True)

    def close(self, done: Iterable[str], failed: Iterable[str]) -> None:
        """Print the final line (and end the terminal line)."""
        self.update([], done, failed, 0, force=True)
        if self._tty and self._drawn and self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def _journal_stamp(path: Path) -> tuple[int, int, int] | None:
    """Which file ``path`` is and how far written (None: no such file)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"
