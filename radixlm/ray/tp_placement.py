"""Tensor parallelism over Ray nodes: the ranks of one replica placed by its placement
group, the rendezvous address handed over by Ray.

With `--nnodes N` the replica's deployment reserves N bundles, STRICT_SPREAD (one node
each; application.py); Serve puts the replica in bundle 0. `start_tp_nodes`, run by the replica,
picks the rendezvous HOST:PORT on its own node (torch.distributed's TCP store, where
global rank 0 listens), and starts one `TPNodeRanks` actor in each bundle k = 1..N-1,
which runs `radixlm serve --node-rank k --dist-init-addr HOST:PORT` (that node's scheduler
ranks only: tp_size / N of them, runtime/tp_ranks.py) as its child. The replica then
starts node 0's server; all ranks meet over gloo (CPU) or NCCL (GPU). The actors die with
the replica (it kills them when it stops; they are its children in Ray's ownership); an
actor going away stops its node's ranks with STOP_SIGNAL, which a follower node obeys at
once (a SIGTERM it would leave to node 0).
"""

from __future__ import annotations

import ray
from ray.util.placement_group import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from radixlm.config import ServerArgs
from radixlm.ray.child_server import ChildServer, free_port
from radixlm.runtime.process_utils import STOP_SIGNAL


@ray.remote(num_cpus=0)
class TPNodeRanks:
    """The scheduler ranks of TP node `args.node_rank` of one replica."""

    def __init__(self, args: ServerArgs) -> None:
        self.node_ip = ray.util.get_node_ip_address()
        self.server = ChildServer(args, host=self.node_ip)

    def where(self) -> tuple[str, bool]:
        """(this node's IP, whether the ranks still run)."""
        return self.node_ip, self.server.alive()

    def __del__(self) -> None:
        # STOP_SIGNAL, not SIGTERM: a follower node takes a first SIGTERM as a note and
        # waits for node 0 (tp_ranks.FollowerSignals), which may already be gone.
        self.server.stop(timeout_s=10, sig=STOP_SIGNAL)


def start_tp_nodes(args: ServerArgs, host: str) -> tuple[ServerArgs, list]:
    """Node 0's ServerArgs (with the rendezvous address) and the actors of nodes 1..N-1."""
    pg = get_current_placement_group()
    if pg is None:
        raise RuntimeError("--nnodes > 1 on Ray needs the replica's placement group "
                           "(build_app reserves one bundle per node)")
    args = args.replace(dist_init_addr=f"{host}:{free_port(host)}")
    actors = [TPNodeRanks.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=k)).remote(args.replace(node_rank=k))
        for k in range(1, args.nnodes)]
    return args, actors
