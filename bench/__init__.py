"""Benchmarks: each module measures one thing and prints its figures.

Run one from the repository root as `python -m bench.<name>` (`--help` lists its options);
`bench/README.md` says what each measures and where its current figures are written down.
Shared helpers live in `bench.common` (percentiles, process CPU, waiting for a server, an
in-process Gateway) and `bench.conversations` (the tool conversations in each protocol).
"""
