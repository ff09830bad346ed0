"""Process topology: the scheduler loop, building a scheduler, the processes and their threads,
distributed set-up, device and dtype choice, host plumbing (docs/request-path.md, "Processes")."""
