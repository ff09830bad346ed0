"""Tokenizer side: loading (with a cache for GGUF tokenizers) and incremental detokenizing."""
