"""GET /dashboard: a live page of the pools, the radix tree, the scheduler's steps and the
requests (docs/dashboard.md). `install_dashboard` adds its routes to a server's app."""

from radixlm.server.dashboard.routes import install_dashboard

__all__ = ["install_dashboard"]
