"""Carry out the monitor's actions through the Slurm adapter; one journal line each.

The only side-effect module of the monitor. Every action yields an :class:`Outcome`, failed
or not, so the loop can hand failures back to :func:`slurmiso.monitor.decide.failed` and keep
running: a slurmctld that stops answering mid-cycle costs this cycle, not the monitor.

MIG layouts are applied *on the node* (its GPUs, its state dir): ``slurmiso mig apply`` is run
there through ``node_exec`` (e.g. ``ssh {node}``); with no ``node_exec`` it runs on this host
with ``SLURMD_NODENAME`` set, which is right for the sandbox and for a monitor on the node.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from slurmiso.errors import SlurmisoError, SlurmUnavailable
from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.actions import KIND
from slurmiso.monitor.calls import quote
from slurmiso.state.journal import MONITOR_SOURCE

if TYPE_CHECKING:
    from slurmiso.config.model import Config

log = logging.getLogger(__name__)

HOLD_BATCH = 500  # job ids per scontrol hold/release/update call
DOWN = "Slurm stopped answering"


#: What a ladder call's answer says in its journal line.
_NOTES = {"already": "Slurm shows the job as asked already",
          "gone": "the job had ended: nothing to do"}


@dataclass
class Outcome:
    action: Action
    ok: bool
    error: str = ""
    #: What Slurm said of an action that needed nothing ("already suspended", "ended").
    note: str = ""


class Applier:
    """Applies actions with ``slurm`` (a :class:`~slurmiso.slurm.client.SlurmCli`)."""

    def __init__(
        self,
        cfg: Optional[Config],
        slurm: Any,
        journal: Any = None,
        node_exec: str = "",
        gres_out: str = "",
        after_relayout: str = "",
        run: Optional[Callable[..., subprocess.CompletedProcess[str]]] = None,
    ) -> None:
        self.cfg = cfg
        self.slurm = slurm
        self.journal = journal
        self.node_exec = node_exec
        self.gres_out = gres_out
        self.after_relayout = after_relayout
        self._run = run or subprocess.run

    def apply(self, actions: Sequence[Action], dry_run: bool = False,
              stop: Optional[Callable[[], bool]] = None) -> List[Outcome]:
        """Apply (or, dry-run, only journal) ``actions`` in order. Job actions go in batches
        of :data:`HOLD_BATCH`; ``stop()`` is asked between batches (SIGTERM finishes the batch
        under way, the rest is reported not done); once Slurm stops answering the rest of
        the cycle is not tried (one timeout, not one per job)."""
        outcomes: List[Outcome] = []
        i = 0
        halt = ""
        while i < len(actions):
            act = actions[i]
            if not halt and stop is not None and stop():
                halt = "stopped (SIGTERM) before this action: nothing was changed"
            if halt:
                outcomes += [Outcome(a, False, halt) for a in actions[i:]]
                break
            if dry_run:
                outcomes.append(Outcome(act, True))
                i += 1
                continue
            spec = KIND[act.kind]
            if spec.batch is not None:
                j = i
                while j < len(actions) and actions[j].kind == act.kind:
                    j += 1
                groups: Dict[Any, List[Action]] = {}
                for a in actions[i:j]:
                    groups.setdefault(spec.group(a), []).append(a)
                for group in groups.values():
                    for k in range(0, len(group), HOLD_BATCH):
                        if halt or (stop is not None and stop() and k > 0):
                            halt = halt or "stopped (SIGTERM) before this batch"
                            outcomes += [Outcome(a, False, halt) for a in group[k:]]
                            break
                        done = self._batch(group[k:k + HOLD_BATCH])
                        outcomes += done
                        halt = next((o.error for o in done if o.error.startswith(DOWN)), "")
                    if halt:
                        seen = {id(o.action) for o in outcomes}
                        outcomes += [Outcome(a, False, halt) for g in groups.values()
                                     for a in g if id(a) not in seen]
                        break
                i = j
                continue
            out = self._one(act)
            outcomes.append(out)
            if out.error.startswith(DOWN):
                halt = out.error
            i += 1
        for out in outcomes:
            self._journal(out, dry_run)
        return outcomes

    # ------------------------------------------------------------------------- internals
    def _batch(self, acts: Sequence[Action]) -> List[Outcome]:
        batch = KIND[acts[0].kind].batch
        assert batch is not None
        try:
            batch(self, [a.target for a in acts], acts[0].details)
            return [Outcome(a, True) for a in acts]
        except SlurmUnavailable as exc:
            return [Outcome(a, False, f"{DOWN}: {exc}") for a in acts]
        except SlurmisoError as exc:
            if len(acts) == 1:
                return [Outcome(acts[0], False, str(exc))]
            log.info("monitor: %s of %d jobs failed (%s); one at a time", acts[0].name,
                     len(acts), exc)
        out: List[Outcome] = []
        for a in acts:
            res = self._batch([a])
            out += res
            if res[0].error.startswith(DOWN):
                out += [Outcome(b, False, res[0].error) for b in acts[len(out):]]
                break
        return out

    def comment(self, ids: List[str], text: str) -> None:
        """The hold's note for its owner (or its removal) after the hold or release itself:
        the note only explains, so a refusal is logged and the hold or release stands."""
        try:
            self.slurm.update_jobs(ids, {"Comment": quote(text)})
        except SlurmisoError as exc:
            log.warning("monitor: the comment of job(s) %s was not %s: %s",
                        ",".join(ids[:5]) + (",..." if len(ids) > 5 else ""),
                        "set" if text else "removed", exc)

    def _note_restraint(self, act: Action) -> None:
        """Write the restraint the job is left with (``details.left``, from
        :func:`slurmiso.monitor.bound.annotate`) in its ``AdminComment``, where the node
        reads it without the monitor (issue 33); a release removes it. The note only
        explains and bounds: a refusal is logged and the action stands."""
        try:
            self.write_restraint(act)
        except SlurmisoError as exc:  # a job that ended may refuse it: nothing to explain
            log.log(logging.INFO if act.kind == ActionKind.LADDER_END else logging.WARNING,
                    "monitor: job %s: the restraint note was not %s: %s", act.target,
                    "written" if act.details.get("left") else "removed", exc)

    def write_restraint(self, act: Action) -> None:
        """The note of ``details.left`` (none: removed) in the job's ``AdminComment``;
        :class:`~slurmiso.errors.SlurmisoError` when Slurm refuses it. A host-limit note
        carries its level (``lvl=``), the node's to apply."""
        if "left" not in act.details:
            return
        from slurmiso.restraints import Note, OnBound, RestraintStep, write_note

        left = act.details["left"]
        note = None if not left else Note(
            RestraintStep(left["step"]), float(left["since"]), str(left["node"]),
            int(left["gpu"]), str(left.get("cause") or ""), float(left["max_s"]),
            OnBound(left["on_bound"]), int(left.get("level") or 0))
        write_note(self.slurm, act.target, note)

    def _one(self, act: Action) -> Outcome:
        spec = KIND[act.kind]
        try:
            if spec.call is None:
                raise SlurmisoError(f"monitor action {act.name!r} is applied in batches")
            said = spec.call(self, act)
            if spec.ladder and said not in ("gone", "noted"):
                self._note_restraint(act)
        except SlurmUnavailable as exc:
            return Outcome(act, False, f"{DOWN}: {exc}")
        except SlurmisoError as exc:
            return Outcome(act, False, str(exc))
        if not spec.ladder:
            return Outcome(act, True)
        return Outcome(act, True, note=_NOTES.get(said, ""))

    def reconcile(self, node: str, live_jobs: List[str]) -> Any:
        """What ended jobs left on ``node``, cleaned up; the fixes made."""
        from slurmiso.isolation.lifecycle import reconcile_node

        if self.cfg is None:
            raise SlurmisoError("reconcile needs the config")
        return reconcile_node(self.cfg, node, False, live_jobs)

    def relayout(self, node: str, layout: str) -> None:
        """``mig apply`` on the node, regenerate its gres.conf, run the after-hook."""
        self._on_node(node, ["mig", "apply", "--layout", layout, "--node", node])
        if self.gres_out:
            path = self.gres_out.replace("{node}", node)
            self._on_node(node, ["gen", "gres-conf", "--node", node, "-o", path])
        if self.after_relayout:
            self._shell(self.after_relayout.replace("{node}", node))

    def _on_node(self, node: str, args: List[str]) -> None:
        if self.node_exec:
            argv = shlex.split(self.node_exec.replace("{node}", node)) + ["slurmiso", *args]
            env = None
        else:
            argv = [sys.executable, "-m", "slurmiso"]
            if self.cfg is not None and self.cfg.source:
                argv += ["--config", self.cfg.source]
            argv += args
            env = dict(os.environ, SLURMD_NODENAME=node)
        self._check(argv, env)

    def _shell(self, command: str) -> None:
        self._check(shlex.split(command), None)

    def _check(self, argv: List[str], env: Optional[Dict[str, str]]) -> None:
        try:
            cp = self._run(argv, env=env, text=True, capture_output=True, timeout=600,
                           check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmisoError(f"{' '.join(argv)}: {exc}") from None
        if cp.returncode != 0:
            tail = (cp.stderr or cp.stdout or "").strip().splitlines()
            raise SlurmisoError(f"{' '.join(argv[-6:])} failed ({cp.returncode}): "
                                f"{tail[-1] if tail else 'no output'}")

    def _journal(self, out: Outcome, dry_run: bool) -> None:
        act = out.action
        fields: Dict[str, Any] = {"source": MONITOR_SOURCE, "action": act.name,
                                  "target": act.target, "reason": act.reason, "dry_run": dry_run,
                                  "details": act.details, "ok": out.ok}
        if out.error:
            fields["error"] = out.error
        if out.note:
            fields["note"] = out.note
        level = logging.INFO if out.ok else logging.WARNING
        log.log(level, "monitor: %s%s%s", "(dry-run) " if dry_run else "", act.describe(),
                "" if out.ok else f" -- FAILED: {out.error}")
        if self.journal is not None:
            try:
                self.journal.append("monitor-action", **fields)
            except OSError as exc:
                log.warning("monitor: cannot write the journal %s: %s", self.journal, exc)
