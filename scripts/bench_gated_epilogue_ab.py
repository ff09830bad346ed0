"""The AMX tiles' fused gate_up epilogue (act(gate) * up written by the GEMM) vs the GEMM
then the act * up kernel, one engine, interleaved (the order flips every round):

    PYTHONPATH=$PWD python scripts/bench_gated_epilogue_ab.py MODEL|default BATCH ROUNDS

Per round and mode one static batch of BATCH 128-token prompts (fresh ones per mode: no
radix-cache hits) is prefilled in one step and decodes 16 steps; prints the prefill times
and median decode steps per mode and the ratios plain / fused. Needs a CPU with AMX-BF16
(elsewhere no layer has the fused path, and the script says so).
"""

from __future__ import annotations

import statistics
import sys

from radixlm.bench.one_batch import interleaved_modes, static_batch_args
from radixlm.engine import Engine
from radixlm.models.loader import resolve_model_path
from radixlm.models.parallel_layers import ColumnParallelLinear


def main() -> None:
    model, batch, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    engine = Engine(resolve_model_path(None if model == "default" else model),
                    **static_batch_args(batch, 128, 16))
    fused = {layer: layer.method_gated for layer in engine.scheduler.runner.model.modules()
             if isinstance(layer, ColumnParallelLinear) and layer.method_gated is not None}
    if not fused:
        sys.exit("no layer has the fused gate_up path here (it needs AMX-BF16 tiles)")

    def set_fused(on: bool) -> None:
        for layer, gated in fused.items():
            layer.method_gated = gated if on else None

    runs = interleaved_modes(engine, {"fused": lambda: set_fused(True),
                                      "plain": lambda: set_fused(False)}, [batch], rounds)
    set_fused(True)
    med = {}
    for mode in ("fused", "plain"):
        prefill = [r.prefill_s * 1e3 for r in runs[(batch, mode)]]
        steps = [statistics.median(r.decode_step_s) * 1e3 for r in runs[(batch, mode)]]
        med[mode] = statistics.median(prefill), statistics.median(steps)
        print(mode, "prefill ms", [f"{v:.0f}" for v in prefill],
              "step ms", [f"{v:.1f}" for v in steps])
    print(f"prefill plain/fused {med['plain'][0] / med['fused'][0]:.3f}, "
          f"step plain/fused {med['plain'][1] / med['fused'][1]:.3f}")


if __name__ == "__main__":
    main()
