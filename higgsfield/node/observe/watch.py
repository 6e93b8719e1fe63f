"""A node's live feed for the dashboard: machine samples, plus its runs and queue as they change.

``higgsfield invoker stats --follow --project P`` prints one JSON line per tick (the
dashboard holds one such command per node, over the SSH connection it keeps)::

    {"node": {...NodeSample...}}                              every ``every`` seconds
    {"runs": [record, ...], "full": true, "queue": [...]}     at start, then when they change

``runs`` are the project's run records as ``invoker status`` prints them (the same
:func:`~higgsfield.node.runs.stop.refresh`, so a dead supervisor's run shows failed
here too, :func:`node_runs`), each with the run's ``params`` from its spec. After the first (``full``)
line only the records that changed are sent; a run directory that went away sends
the full list again. ``queue`` is :func:`higgsfield.node.gang.queue.describe` of the
node's queue (who holds which slots, who waits, in order), sent when it changes.
``{"skipped": [line, ...]}`` names the project's files that do not decode (a damaged
record hides its own run only), sent when that list changes.

Records are checked every ``RECORDS_EVERY_S`` (a run's state shows within that), but
cheaply: each look stats the active runs' records only (and run directories whose
record is not written yet); the finished runs' records are looked at when the runs
directory changed (a run appeared or went) and every ``WHOLE_EVERY`` looks, and read
again only when their file changed (records are replaced whole: a new mtime). A node
with 200 finished runs costs a ``stat`` per look, and 200 every 5 s.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from higgsfield.contract.codec import encode
from higgsfield.contract.decode import skip_line
from higgsfield.contract.errors import RunError
from higgsfield.contract.states import TERMINAL
from higgsfield.node.gang import queue
from higgsfield.node.observe.stats import Sampler
from higgsfield.node.runs.stop import refresh
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.placement import read_run_spec
from higgsfield.node.state.records import RunDir, scan_runs

RECORDS_EVERY_S = 0.5
WHOLE_EVERY = 10        # every this many looks (5 s) the finished runs' records are looked at too


class RunsWatch:
    """The project's run records on this node, and which of them changed since the last look."""

    def __init__(self, home: NodeState, project: str) -> None:
        self.home = home
        self.project = project
        self._mtimes: dict[str, float] = {}
        self._known: dict[str, str] = {}          # run -> its record's JSON, as last sent
        self._states: dict[str, str] = {}         # run -> its state, as last sent
        self._params: dict[str, Any] = {}
        self._queue_key: tuple[float, str] | None = None
        self._sent_once = False
        self._tick = 0
        self._root_mtime: float | None = None
        self._dirs: list[str] = []
        self._bad: dict[str, tuple[float, str]] = {}   # run -> (its record's mtime, why it was skipped)
        self._bad_dirs: list[str] = []                 # skip lines of directories that cannot be runs

    @property
    def skipped(self) -> list[str]:
        """One line per file or directory of the project that does not decode (as ``invoker status`` says)."""
        return [*self._bad_dirs, *(why for _, why in self._bad.values())]

    def _root(self) -> Path:
        return self.home.runs_of(self.project)

    def _names(self) -> tuple[list[str], bool]:
        """The run directories to look at now, and whether this is a whole look (every run)."""
        self._tick += 1
        try:
            root_mtime = self._root().stat().st_mtime
        except OSError:
            root_mtime = None
        whole = (not self._sent_once or root_mtime != self._root_mtime or self._tick % WHOLE_EVERY == 0)
        if whole:
            self._root_mtime = root_mtime
            rds, self._bad_dirs = scan_runs(self.home, self.project, pending=True)
            self._dirs = [rd.run for rd in rds]
            return self._dirs, True
        # between whole looks: the active runs, and directories whose record was not written yet
        return [n for n in self._dirs if n not in self._known or self._states.get(n) not in TERMINAL], False

    def changed(self) -> tuple[list[dict[str, Any]], bool] | None:
        """(records, full): every record the first time or after a run vanished, else the changed ones."""
        names, whole = self._names()
        rds = {n: RunDir(self.home, self.project, n) for n in names}
        full = not self._sent_once or (whole and bool(set(self._known) - set(rds)))
        self._sent_once = True
        out: list[dict[str, Any]] = []
        for name, rd in rds.items():
            try:
                mtime = os.lstat(rd.record_path).st_mtime
            except OSError:
                continue
            old = self._known.get(name)
            if old is not None and mtime == self._mtimes.get(name) and self._states.get(name) in TERMINAL:
                if full:
                    out.append(json.loads(old))
                continue
            if self._bad.get(name, (None,))[0] == mtime:
                continue            # damaged, and not written since: said once
            try:
                rec = refresh(rd)
            except FileNotFoundError:
                continue
            except (OSError, ValueError, RunError) as e:
                self._bad[name] = (mtime, skip_line(f"{rd.rel}/run.json", _why(e)))
                continue
            self._bad.pop(name, None)
            if name not in self._params:
                self._params[name] = _params(rd)[0]
            record = {**encode(rec), "params": self._params[name]}   # the record as a view sends it
            text = json.dumps(record, sort_keys=True)
            self._mtimes[name] = mtime
            if text != old or full:
                self._known[name] = text
                self._states[name] = rec.state
                out.append(record)
        if whole:
            for gone in set(self._known) - set(rds):
                for d in (self._known, self._mtimes, self._states, self._params):
                    d.pop(gone, None)
            for gone in set(self._bad) - set(rds):
                self._bad.pop(gone)
        if not out and not full:
            return None
        return out, full

    def queue_changed(self, force: bool = False) -> list[dict[str, Any]] | None:
        """The node's queue when it changed since the last look (or ``force``), else None."""
        try:
            mtime = self.home.queue_file.stat().st_mtime
        except OSError:
            mtime = 0.0
        entries = queue.describe(queue.snapshot(self.home)) if force or mtime != (self._queue_key or (None,))[0] \
            else None
        if entries is None:
            return None
        key = (mtime, json.dumps(entries, sort_keys=True))
        if key == self._queue_key and not force:
            return None
        self._queue_key = key
        return entries


def _params(rd: RunDir) -> tuple[dict[str, Any], str | None]:
    """The run's resolved params, from its spec, and why there are none when its spec does not decode
    (None: it decoded, or there is none, as for a run an older invoker started)."""
    try:
        return dict(read_run_spec(rd.spec_path).params), None
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError, RunError) as e:
        return {}, _why(e)


def _why(e: BaseException) -> str:
    """An error reading a file, as a skip line's reason (an OSError's words, not its path)."""
    if isinstance(e, OSError):
        return e.strerror or type(e).__name__
    text = str(e)
    return text.rsplit(".json: ", 1)[-1] if ".json: " in text else text


def node_runs(home: NodeState, project: str | None = None,
              run: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """What ``invoker status`` replies: the runs' records (refreshed, each with ``params`` from its spec),
    and one skip line per file that does not decode (``runs/p/x/run.json: not JSON (...)``).

    A damaged record hides only its own run: every other run of the node still shows.
    """
    rds, skipped = scan_runs(home, project)
    out: list[dict[str, Any]] = []
    for rd in rds:
        if run is not None and rd.run != run:
            continue
        try:
            rec = refresh(rd)
        except FileNotFoundError:
            continue                # removed while we looked
        except (OSError, ValueError, RunError) as e:
            skipped.append(skip_line(f"{rd.rel}/run.json", _why(e)))
            continue
        params, why = _params(rd)
        if why is not None:
            skipped.append(skip_line(f"{rd.rel}/spec.json", why))
        out.append({**encode(rec), "params": params})   # the record as a view sends it
    return out, skipped


def feed(home: NodeState, *, every: float, project: str | None, emit: Callable[[dict[str, Any]], None],
         ticks: int | None = None) -> None:
    """Emit samples every ``every`` s and (with ``project``) runs and queue as they change; ``ticks``: stop after."""
    sampler = Sampler(home, every=every)
    watch = RunsWatch(home, project) if project else None
    next_sample = 0.0
    n = 0
    last_skipped: list[str] = []
    try:
        while ticks is None or n < ticks:
            n += 1
            now = time.monotonic()
            if watch is not None:
                runs = watch.changed()
                q = watch.queue_changed(force=runs is not None)
                skipped = watch.skipped
                if runs is not None or q is not None or skipped != last_skipped:
                    update: dict[str, Any] = {}    # a line of the watch feed (not the gang wire)
                    if runs is not None:
                        update["runs"], update["full"] = runs
                    if q is not None:
                        update["queue"] = q
                    if skipped != last_skipped:
                        update["skipped"] = last_skipped = skipped
                    emit(update)
            if now >= next_sample:
                next_sample = now + every
                emit({"node": encode(sampler.sample())})
            time.sleep(min(RECORDS_EVERY_S, every) if watch is not None else every)
    finally:
        sampler.close()
