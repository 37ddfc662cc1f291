"""Anthropic Messages (Claude Code): `request` (wire models → `CanonicalRequest`, and
`count_tokens`) and `reply` (the `message` object, its event stream and Anthropic errors)."""
