"""Executor: ScheduleBatch -> ForwardBatch -> logits -> sampled tokens."""
