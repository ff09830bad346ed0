"""Memory planning and OOM diagnosis: sizes the pools before they exist and explains a failed
forward (docs/memory.md)."""
