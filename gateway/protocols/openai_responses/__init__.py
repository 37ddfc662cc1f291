"""OpenAI Responses (Codex CLI): `request` (wire models → `CanonicalRequest`) and
`reply` (the `response` object, its event stream and the compaction reply)."""
