"""Scheduling: Req, ScheduleBatch, PrefillAdder, the Scheduler step and its process loop."""
