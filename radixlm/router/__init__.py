"""Cache-aware load balancing over several engine instances (`radixlm router`,
`radixlm serve --dp-size N`). See docs/router.md."""
