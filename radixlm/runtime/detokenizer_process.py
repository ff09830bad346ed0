"""The detokenizer process: BatchTokenIDOut from the scheduler -> BatchStrOut to the API."""

from __future__ import annotations

import zmq

from radixlm.config import ServerArgs
from radixlm.ipc import IpcEndpoints, dumps, loads, make_socket
from radixlm.messages import BatchTokenIDOut
from radixlm.runtime.process_threads import setup_helper_threads
from radixlm.runtime.process_utils import (
    die_with_parent, leave_shutdown_to_parent, set_process_name, setup_logging,
)


def run_detokenizer_process(args: ServerArgs, endpoints: IpcEndpoints) -> None:
    die_with_parent()
    leave_shutdown_to_parent()  # a group SIGTERM/SIGINT: the parent drains first
    set_process_name("radixlm-detok")
    setup_logging(args.log_level, "detokenizer")
    setup_helper_threads()  # before torch loads (below, with transformers)
    from radixlm.model_path import resolve_model_path
    from radixlm.tokenizer.detokenizer import Detokenizer
    from radixlm.tokenizer.loader import load_tokenizer

    detok = Detokenizer(load_tokenizer(resolve_model_path(args.model), args.tokenizer))
    ctx = zmq.Context()
    recv = make_socket(ctx, zmq.PULL, endpoints.detokenizer_input, bind=True)
    send = make_socket(ctx, zmq.PUSH, endpoints.api_input, bind=False)
    while True:
        msg = loads(recv.recv())
        # Token outputs are detokenized; control replies pass through.
        send.send(dumps(detok.handle_batch(msg) if isinstance(msg, BatchTokenIDOut) else msg))
