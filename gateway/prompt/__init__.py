"""The prompt: chat templates, model files, the tokenizer pool and incremental
tokenization (held tokens), from canonical messages to the token ids sent to an engine.

The bottom room: it imports no other room (only the shared base).
"""
