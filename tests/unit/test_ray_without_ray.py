"""The router's policy (one policy, two hosts: `radixlm router` and Ray Serve) and the
Ray app's Ray-free parts import and work with Ray absent; the request the ingress hands
the policy carries the same routing text `radixlm router` routes by; a replica's engine
is started with exactly the ServerArgs it was given."""

import json
import subprocess
import sys

from radixlm.config import ServerArgs, from_cli_args
from radixlm.ray.child_server import server_flags
from radixlm.ray.routed_request import routed_request
from radixlm.router.request_text import routing_text


def test_policy_module_imports_without_ray():
    code = (
        "import sys; sys.modules['ray'] = None\n"  # `import ray` now raises ImportError
        "from radixlm.router.cache_aware import CacheAwarePolicy\n"
        "from radixlm.router.policy import RoundRobinPolicy\n"
        "from radixlm.router.workers import Worker\n"
        "import radixlm.ray, radixlm.ray.config, radixlm.ray.routed_request\n"
        "from radixlm.cli import build_parser\n"
        "assert build_parser().parse_args(['serve-ray', '--num-replicas', '3']).num_replicas == 3\n"
        "p = CacheAwarePolicy(); w = [Worker('a'), Worker('b')]\n"
        "first = p.select('shared prefix one', w).worker\n"
        "assert p.select('shared prefix two', w).worker is first\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_routed_request_carries_the_routers_routing_text():
    chat = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}],
            "stream": True}
    req = routed_request("post", "/v1/chat/completions", "", json.dumps(chat).encode(),
                         {"Content-Type": "application/json", "Host": "x", "Authorization": "B k"})
    assert req.prompt == routing_text("/v1/chat/completions", chat) != ""
    assert req.stream and req.method == "POST"
    assert req.headers == {"content-type": "application/json", "authorization": "B k"}
    ids = routed_request("POST", "/generate", "", b'{"input_ids": [1, 2, 3]}', {})
    assert ids.prompt == "1 2 3" and not ids.stream
    bad = routed_request("POST", "/v1/completions", "", b"{not json", {})
    assert bad.prompt == "/v1/completions" and bad.body == b"{not json"  # the engine's 400
    models = routed_request("GET", "/v1/models", "a=1", b"", {})
    assert models.path == "/v1/models?a=1" and models.prompt == "/v1/models"  # never ""


def test_server_flags_rebuild_the_server_args():
    from radixlm.cli import build_parser

    args = ServerArgs(model="/m", tp_size=2, nnodes=2, node_rank=1, dist_init_addr="h:1",
                      disable_radix_cache=True, max_total_tokens=4096, device_memory="2GiB")
    ns = build_parser().parse_args(["serve", *server_flags(args)])
    assert from_cli_args(ns) == args
