"""The prompt: chat templates, model files, the tokenizer pool and incremental
tokenization (held tokens), from canonical messages to the token ids sent to an engine.

It must not import the HTTP app, protocols, sessions, calls, engines or capture.
"""
