"""Scheduling: Req, RequestKV (its KV rows and pages), ScheduleBatch, PrefillAdder, the Scheduler step."""
