"""OpenAI Chat Completions: `request` (wire models → `CanonicalRequest`) and `reply`
(a `CompletionResult` as a `chat.completion`, its chunk stream and OpenAI-shaped errors)."""
