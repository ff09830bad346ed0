"""TP=2 of one Ray Serve replica across two Ray nodes (`ray.cluster_utils.Cluster`, two
raylets on this machine, one CPU each): the deployment's placement group puts the replica
(node rank 0, the HTTP server) in bundle 0 and the other node's rank in bundle 1 on the
other node (STRICT_SPREAD); they meet over gloo at the address the replica handed out.
Greedy answers equal a TP=1 `radixlm serve` of the same tiny random Llama."""

from __future__ import annotations

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from ray.cluster_utils import Cluster  # noqa: E402

from radixlm.config import ServerArgs  # noqa: E402
from radixlm.ray.application import build_app  # noqa: E402
from radixlm.ray.config import RayServeArgs  # noqa: E402
from tests.conftest import make_tiny_llama  # noqa: E402
from tests.process_tree import free_port  # noqa: E402
from tests.server_harness import running_server  # noqa: E402

pytestmark = pytest.mark.slow

FLAGS = dict(device="cpu", dtype="float32", max_total_tokens=2048, max_running_requests=4,
             log_level="warning", num_threads=1)
PROMPTS = [[5, 17, 33, 2, 9], [100, 101, 102], [7] * 12]


def answers(url: str) -> list[list[int]]:
    out = []
    for ids in PROMPTS:
        r = httpx.post(url + "/generate", json={"input_ids": ids, "sampling_params": {
            "max_new_tokens": 10, "temperature": 0, "ignore_eos": True}}, timeout=300)
        assert r.status_code == 200, r.text
        out.append(r.json()["output_ids"])
    return out


def test_tp2_across_two_ray_nodes_matches_tp1(tmp_path):
    model = make_tiny_llama(str(tmp_path / "tiny"), heads=4, kv_heads=2, seed=3)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 80 * 2**20, "include_dashboard": False})
    cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = ServerArgs(model=model, tp_size=2, nnodes=2, **FLAGS)
        serve.run(build_app(RayServeArgs(num_replicas=1, num_cpus_per_replica=1), args),
                  name="tp", route_prefix="/tp")
        table = ray.util.placement_group_table()
        created = [pg for pg in table.values() if pg["state"] == "CREATED"]
        assert len(created) == 1 and len(created[0]["bundles"]) == 2, table
        assert len(set(created[0]["bundles_to_node_id"].values())) == 2, created  # two nodes
        got = answers(f"http://127.0.0.1:{port}/tp")
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
    with running_server(model, *[f"--{k.replace('_', '-')}={v}" for k, v in FLAGS.items()]
                        ) as single:
        want = answers(single.url)
    assert got == want
