"""radixlm: an LLM serving engine in the SGLang mould (public API: Engine, SamplingParams)."""

from radixlm.sampling_params import SamplingParams

__version__ = "0.1.0"


def __getattr__(name: str):
    # Engine pulls in torch and the model code; import it only when asked for.
    if name == "Engine":
        from radixlm.engine import Engine

        return Engine
    raise AttributeError(name)


__all__ = ["Engine", "SamplingParams", "__version__"]
