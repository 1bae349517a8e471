"""A file of excluded hosts for the next launch: ``srun --exclude=PATH`` and a torchrun hostfile.

The exclude file holds one host name per line, every one of them put there by laggard (the file
is laggard's own: a person's exclusions go in another file). ``srun --exclude`` reads a file when
its argument contains a ``/`` (srun(1)), so ``srun --exclude=/var/lib/laggard/exclude`` keeps
the next job off them. With ``hosts`` (a hostfile listing every host, one per line, optionally
followed by fields such as ``slots=8``, as DeepSpeed's and mpirun's hostfiles are) the
``hostfile`` is rewritten with the excluded hosts' lines left out, for a torchrun launcher
script that starts one ``torchrun --nnodes`` per line. Both files are replaced atomically
(written aside, then renamed), so a launch never reads half a file.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from laggard.actions.audit import Decision, record

#: What :meth:`ExcludeFile.held_reason` says of a host in the file.
EXCLUDED_REASON = "laggard:excluded"


def _write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class ExcludeFile:
    """Add a host to the exclude file (quarantine) and take it out again (release).

    Args:
        path: the exclude file (created on first use; its directory must exist).
        act: write the files; False (the default) records what would be written.
        hosts: a hostfile of every host; with ``hostfile``, rewritten minus the excluded ones.
        hostfile: where that filtered hostfile goes.
        source: written on each audit line.
        log: the audit logger; ``laggard.audit`` when None.
    """

    name = "exclude"
    release_name = "include"

    def __init__(self, path: Path, *, act: bool = False, hosts: Path | None = None,
                 hostfile: Path | None = None, source: str = "remediate",
                 log: logging.Logger | None = None) -> None:
        self.path = Path(path)
        self.act = act
        self.hosts = hosts
        self.hostfile = hostfile
        self.source = source
        self.log = log

    def excluded(self) -> list[str]:
        """The hosts in the exclude file, in its order (none when it does not exist)."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]

    def _commit(self, action: str, node: str, why: str, reason: str, excluded: list[str],
                skip: str | None) -> Decision:
        def decision(outcome: str, detail: str) -> Decision:
            return record(Decision(action=action, target=node, outcome=outcome, why=why,
                                   reason=reason, detail=detail, source=self.source),
                          log=self.log)

        if skip is not None:
            return decision("skipped", skip)
        what = f"{'add' if action == 'exclude' else 'remove'} {node} " \
               f"{'to' if action == 'exclude' else 'from'} {self.path}"
        if self.hosts is not None and self.hostfile is not None:
            what += f" and rewrite {self.hostfile}"
        if not self.act:
            return decision("would_act", what)
        try:
            _write(self.path, "".join(f"{h}\n" for h in excluded))
            if self.hosts is not None and self.hostfile is not None:
                keep = [ln for ln in self.hosts.read_text().splitlines(keepends=True)
                        if not ln.split() or ln.split()[0] not in excluded]
                _write(self.hostfile, "".join(keep))
        except OSError as exc:
            return decision("failed", f"{what}: {exc}")
        return decision("acted", what)

    def quarantine(self, node: str, reason: str, *, why: str) -> Decision:
        """Add ``node`` to the exclude file (skipped when it is there). Never raises."""
        try:
            excluded = self.excluded()
        except OSError as exc:
            return self._fail("exclude", node, why, reason, exc)
        skip = f"already in {self.path}" if node in excluded else None
        return self._commit("exclude", node, why, reason, [*excluded, node], skip)

    def release(self, node: str, *, why: str) -> Decision:
        """Remove ``node`` from the exclude file (skipped when it is not there). Never raises."""
        try:
            excluded = self.excluded()
        except OSError as exc:
            return self._fail("include", node, why, "", exc)
        skip = None if node in excluded else f"not in {self.path}"
        return self._commit("include", node, why, "", [h for h in excluded if h != node], skip)

    def _fail(self, action: str, node: str, why: str, reason: str, exc: OSError) -> Decision:
        return record(Decision(action=action, target=node, outcome="failed", why=why,
                               reason=reason, detail=f"{self.path} unreadable: {exc}",
                               source=self.source), log=self.log)

    def held_reason(self, node: str) -> str:
        """``laggard:excluded`` when ``node`` is in the exclude file, else "". The file keeps
        no reason (srun reads host names only), so after a restart of remediate no resolved
        alert matches it: such a host is taken out of the file by hand."""
        try:
            return EXCLUDED_REASON if node in self.excluded() else ""
        except OSError:
            return ""
