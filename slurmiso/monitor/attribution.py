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

from slurmiso.config.model import SHARED_MODES
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
    what admission must protect. Only shared pools' GPUs are attributed (an exclusive GPU
    has one job). Built once per cycle, O(GPUs + jobs)."""

    def __init__(self, snap: Snapshot, train_classes: Sequence[str]) -> None:
        self.train = frozenset(train_classes)
        self.live: Dict[str, JobInfo] = {j.id: j for j in snap.jobs if j.state in LIVE_STATES}
        self.on_gpu: Dict[GpuKey, List[str]] = {}
        self.gpus_of: Dict[str, List[GpuKey]] = {}
        self._labelled: Set[str] = set()
        self._serving: Dict[Tuple[str, ...], bool] = {}
        self._by_node: Optional[Dict[str, List[JobInfo]]] = None
        named: Set[GpuKey] = set()
        live, labelled, on_gpu, gpus_of = self.live, self._labelled, self.on_gpu, self.gpus_of
        for node in snap.nodes:  # the hot loop of a cycle: 24,000 GPUs at 3,000 nodes
            if node.mode not in SHARED_MODES:
                continue  # a GPU nobody shares: neither admission nor the ladder looks
            name = node.name
            for g in node.gpus:
                if g.jobs:
                    labelled.add(name)
                    key = (name, g.index)
                    named.add(key)
                    for jid in g.jobs:
                        job = live.get(jid)
                        if job is not None and name in job.nodes:  # as Slurm says
                            on_gpu.setdefault(key, []).append(jid)
                            gpus_of.setdefault(jid, []).append(key)
                elif g.classes:
                    labelled.add(name)
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
        self._labelled.add(node)  # the node's records name who holds its GPUs

    def is_train(self, jid: str) -> bool:
        job = self.live.get(jid)
        return job is not None and job.job_class in self.train

    def jobs_on(self, node: str, gpu: int) -> List[JobInfo]:
        return [self.live[j] for j in self.on_gpu.get((node, gpu), ())]

    def _serves(self, classes: Tuple[str, ...]) -> bool:
        """Whether a GPU's class labels name inference (cached per label set)."""
        got = self._serving.get(classes)
        if got is None:
            got = self._serving[classes] = any(c and c not in self.train for c in classes)
        return got

    def inference_on(self, node: str, gpu: GpuSample) -> List[str]:
        """The inference jobs on a GPU (ids; none named where the agent labels only
        classes)."""
        return [j for j in self.on_gpu.get((node, gpu.index), ()) if not self.is_train(j)]

    def inference_gpus(self, node: NodeInfo) -> Optional[FrozenSet[int]]:
        """The GPUs of ``node`` that serve inference; None when the node's samples say
        nothing of who holds them but Slurm shows inference there (then every GPU counts:
        not knowing which one errs towards inference); empty when no inference runs there."""
        found = []
        name = node.name
        on_gpu, serving = self.on_gpu, self._serving
        for g in node.gpus:
            serves = serving.get(g.classes)
            if serves is None:
                serves = self._serves(g.classes)
            if serves:
                found.append(g.index)
            elif on_gpu:
                ids = on_gpu.get((name, g.index))
                if ids and any(not self.is_train(j) for j in ids):
                    found.append(g.index)
        if node.name in self._labelled or found:
            return frozenset(found)
        if any(j.job_class not in self.train for j in self.live_on(node.name)):
            return None
        return frozenset()

    def live_on(self, node: str) -> List[JobInfo]:
        """The live jobs Slurm shows on ``node`` (indexed once per cycle, on first use)."""
        if self._by_node is None:
            self._by_node = {}
            for j in self.live.values():
                for n in j.nodes:
                    self._by_node.setdefault(n, []).append(j)
        return self._by_node.get(node, [])
