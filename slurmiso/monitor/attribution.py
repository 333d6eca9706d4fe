"""Which jobs share which GPU: the one place the monitor ties a GPU to the jobs on it (pure).

A job can lie only about itself. Its own signals may say it answers slowly, never which GPUs
it holds or which jobs it shares them with: a GPU's jobs come from the node's records (the
agent's ``job`` labels, from the records the prolog writes as root) or, for a GPU whose
sample names no job, from the agent's per-job signals (which take the GPUs from the same
records, never from the job); and a job counts on a GPU only
while Slurm shows it running (or suspended) on that very node. So a forged latency from
inference job J reaches only the training jobs on J's own GPUs.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from slurmiso.monitor.snapshot import GpuSample, JobInfo, NodeInfo, Snapshot

#: Slurm states of a job that holds its GPUs.
LIVE_STATES = ("RUNNING", "SUSPENDED")
GpuKey = Tuple[str, int]


def gpu_key(node: str, gpu: int) -> str:
    """A GPU's name in memory and in the journal: ``n3/0``."""
    return f"{node}/{gpu}"


class Attribution:
    """GPU -> the live jobs on it, job -> its GPUs, and which GPUs serve inference.

    "Inference" is every class that is not a training class (unclassified jobs included):
    what admission must protect. Built once per cycle, O(GPUs + jobs)."""

    def __init__(self, snap: Snapshot, train_classes: Sequence[str]) -> None:
        self.train = frozenset(train_classes)
        self.live: Dict[str, JobInfo] = {j.id: j for j in snap.jobs if j.state in LIVE_STATES}
        self.on_gpu: Dict[GpuKey, List[str]] = {}
        self.gpus_of: Dict[str, List[GpuKey]] = {}
        self._labels: Dict[GpuKey, FrozenSet[str]] = {}
        self._labelled: Set[str] = set()
        named: Set[GpuKey] = set()
        by_node: Dict[str, List[JobInfo]] = {}
        for j in self.live.values():
            for n in j.nodes:
                by_node.setdefault(n, []).append(j)
        self._by_node = by_node
        for node in snap.nodes:
            for g in node.gpus:
                if g.jobs or g.classes:
                    self._labelled.add(node.name)
                if g.classes:
                    self._labels[(node.name, g.index)] = frozenset(g.classes)
                if g.jobs:
                    named.add((node.name, g.index))
                for jid in g.jobs:
                    self._add(node.name, g.index, jid)
        for sig in snap.job_signals.values():
            for gpu, _gi in sig.gpus:
                if (sig.node, int(gpu)) not in named:  # named jobs are the authority
                    self._add(sig.node, int(gpu), sig.job)

    def _add(self, node: str, gpu: int, jid: str) -> None:
        job = self.live.get(jid)
        if job is None or node not in job.nodes:
            return  # not (or no longer) on that node as Slurm says: no claim to the GPU
        key = (node, gpu)
        here = self.on_gpu.setdefault(key, [])
        if jid not in here:
            here.append(jid)
            self.gpus_of.setdefault(jid, []).append(key)

    def is_train(self, jid: str) -> bool:
        job = self.live.get(jid)
        return job is not None and job.job_class in self.train

    def jobs_on(self, node: str, gpu: int) -> List[JobInfo]:
        return [self.live[j] for j in self.on_gpu.get((node, gpu), ())]

    def inference_on(self, node: str, gpu: int) -> Tuple[List[str], bool]:
        """Inference job ids on a GPU, and whether a class label says inference is there
        even where the jobs are not named (agents without ``job_labels``)."""
        ids = [j for j in self.on_gpu.get((node, gpu), ()) if not self.is_train(j)]
        labels = self._labels.get((node, gpu), frozenset())
        return ids, bool(ids) or any(c and c not in self.train for c in labels)

    def inference_gpus(self, node: NodeInfo) -> Optional[FrozenSet[int]]:
        """The GPUs of ``node`` that serve inference; None when the node's samples say
        nothing of who holds them but Slurm shows inference there (then every GPU counts:
        not knowing which one errs towards inference); empty when no inference runs there."""
        found = set()
        for g in node.gpus:
            if self.inference_on(node.name, g.index)[1]:
                found.add(g.index)
        if node.name in self._labelled or found:
            return frozenset(found)
        if any(j.job_class not in self.train for j in self._by_node.get(node.name, ())):
            return None
        return frozenset()

    def filled(self, node: NodeInfo) -> Tuple[GpuSample, ...]:
        """``node``'s samples with the jobs and classes attributed to each GPU (for a
        snapshot whose agents did not label them)."""
        import dataclasses

        out = []
        for g in node.gpus:
            ids = tuple(sorted(set(g.jobs) | set(self.on_gpu.get((node.name, g.index), ()))))
            classes = tuple(sorted(set(g.classes) | {self.live[j].job_class for j in ids
                                                     if j in self.live
                                                     and self.live[j].job_class}))
            out.append(g if (ids, classes) == (g.jobs, g.classes)
                       else dataclasses.replace(g, jobs=ids, classes=classes))
        return tuple(out)
