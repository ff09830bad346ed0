"""Speculative decoding: drafters behind one interface and the verify step (docs/speculative.md)."""
