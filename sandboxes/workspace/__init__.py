"""What a new sandbox is given from its spec, the same on every backend: files, repo,
setup and environment (`provisioning`), and repositories cut to their base commit's
history (`repo_trim`)."""
